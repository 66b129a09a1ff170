// Command apdu runs in a test guest: through usbfs (the node in its
// first argument) it powers the simulated key's card, selects its
// application and has it sign a message, then prints the signature
// ("APDU SIGNED <hex>"). Built static for the guest by the test.
//
// With a second argument, a period such as 1s (or that period in
// APDU_EVERY, which a guest's kernel command line sets), it goes on
// signing each period, printing "APDU <n> SIGNED <hex>", until the key
// fails it.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/edgebox/edgebox/internal/test/ccidtest/usbfs"
)

// Message is what the card signs.
const Message = "statement 2026-11, signed in the guest"

func main() {
	period := os.Getenv("APDU_EVERY")
	if len(os.Args) > 2 {
		period = os.Args[2]
	}
	every, _ := time.ParseDuration(period)
	if err := run(os.Args[1], every); err != nil {
		fmt.Println("APDU FAILED", err)
		os.Exit(1)
	}
}

func run(node string, every time.Duration) error {
	card, err := usbfs.Open(node)
	if err != nil {
		return err
	}
	defer card.Close()
	for n := 1; ; n++ {
		sig, err := card.Sign(Message)
		if err != nil {
			return err
		}
		if every <= 0 {
			fmt.Printf("APDU SIGNED %x\n", sig)
			return nil
		}
		fmt.Printf("APDU %d SIGNED %x\n", n, sig)
		time.Sleep(every)
	}
}
