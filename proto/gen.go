// Package proto holds the agent⇄console contract (package edgebox.v1) and
// the generated Go code for it. Run `make proto` after changing a .proto file.
package proto

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative edgebox/v1/edgebox.proto edgebox/v1/desired.proto
