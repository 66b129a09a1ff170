// Command edgebox is the operator's CLI for an edgebox console.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		// A remote command's exit code is the CLI's, with nothing added.
		var exit exitError
		if errors.As(err, &exit) {
			os.Exit(exit.code)
		}
		fmt.Fprintln(os.Stderr, "edgebox:", err)
		os.Exit(1)
	}
}
