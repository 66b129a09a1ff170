// Command edgebox is the operator's CLI for an edgebox console.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "edgebox:", err)
		os.Exit(1)
	}
}
