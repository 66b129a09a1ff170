// Package ccidtest drives a CCID smart-card key as a host's reader
// driver does, for tests and benchmarks: a reader command on bulk OUT,
// its answer read on bulk IN, through any usbdev.Device (the simulated
// key itself, or a key imported over USB/IP). It knows the simulated
// card's application (usbhub/ccid): power on, SELECT, and a signature
// that verifies against ccid.TestKey.
package ccidtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Reader commands (CCID 1.1, section 6.1) and the reader's data answer.
const (
	IccPowerOn   = 0x62 // PC_to_RDR_IccPowerOn
	XfrBlock     = 0x6F // PC_to_RDR_XfrBlock: an APDU to the card
	rdrDataBlock = 0x80 // RDR_to_PC_DataBlock
)

// readLength is what one bulk IN asks for: a whole answer in one
// transfer, as pcsc-lite's CCID driver reads.
const readLength = 4096

// Message is a reader command of type typ with sequence number seq
// carrying body.
func Message(typ, seq byte, body []byte) []byte {
	m := []byte{typ}
	m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
	m = append(m, 0, seq, 0, 0, 0) // slot 0; three bytes the command's own
	return append(m, body...)
}

// SelectAPDU selects the simulated card's application.
func SelectAPDU() []byte {
	return append([]byte{0x00, 0xA4, 0x04, 0x00, byte(len(ccid.AID))}, ccid.AID...)
}

// SignAPDU asks the card to sign msg (PSO: COMPUTE DIGITAL SIGNATURE,
// Lc, msg, Le); msg is 1 to 255 bytes.
func SignAPDU(msg []byte) []byte {
	return append(append([]byte{0x00, 0x2A, 0x9E, 0x9A, byte(len(msg))}, msg...), 0x00)
}

// Command sends one reader command on bulk OUT and reads its answer on
// bulk IN: two transfers, more only when the device gives the answer in
// parts. It checks the answer's sequence number and length.
func Command(ctx context.Context, dev usbdev.Device, typ, seq byte, body []byte) ([]byte, error) {
	if _, err := dev.Transfer(ctx, ccid.EndpointOut, Message(typ, seq, body), 0); err != nil {
		return nil, fmt.Errorf("bulk OUT of command %#x: %w", typ, err)
	}
	return ReadAnswer(ctx, dev, seq)
}

// ReadAnswer reads the reader's answer to command seq on bulk IN.
func ReadAnswer(ctx context.Context, dev usbdev.Device, seq byte) ([]byte, error) {
	var a []byte
	for len(a) < 10 || len(a) < 10+int(binary.LittleEndian.Uint32(a[1:5])) {
		b, err := dev.Transfer(ctx, ccid.EndpointIn, nil, readLength)
		if err != nil {
			return nil, fmt.Errorf("bulk IN: %w", err)
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("bulk IN: an empty answer after %d bytes", len(a))
		}
		a = append(a, b...)
	}
	if a[6] != seq {
		return nil, fmt.Errorf("the answer to command %d says %d: %x", seq, a[6], a)
	}
	return a, nil
}

// PowerOn powers the card and returns its ATR.
func PowerOn(ctx context.Context, dev usbdev.Device, seq byte) ([]byte, error) {
	a, err := Command(ctx, dev, IccPowerOn, seq, nil)
	if err != nil {
		return nil, err
	}
	if a[0] != rdrDataBlock || a[7] != 0 {
		return nil, fmt.Errorf("power on: %x", a)
	}
	return a[10:], nil
}

// APDU sends apdu to the card in an XfrBlock and returns the card's
// response (data and status word).
func APDU(ctx context.Context, dev usbdev.Device, seq byte, apdu []byte) ([]byte, error) {
	a, err := Command(ctx, dev, XfrBlock, seq, apdu)
	if err != nil {
		return nil, err
	}
	if a[0] != rdrDataBlock || a[7] != 0 {
		return nil, fmt.Errorf("XfrBlock %x: the reader answered %x", apdu, a)
	}
	return a[10:], nil
}

// Select selects the card's application.
func Select(ctx context.Context, dev usbdev.Device, seq byte) error {
	r, err := APDU(ctx, dev, seq, SelectAPDU())
	if err != nil {
		return err
	}
	if !bytes.Equal(r, []byte{0x90, 0x00}) {
		return fmt.Errorf("SELECT: the card answered %x", r)
	}
	return nil
}

// Sign has the card sign msg and returns the signature (ASN.1), checked
// against ccid.TestKey.
func Sign(ctx context.Context, dev usbdev.Device, seq byte, msg []byte) ([]byte, error) {
	r, err := APDU(ctx, dev, seq, SignAPDU(msg))
	if err != nil {
		return nil, err
	}
	return CheckSignature(msg, r)
}

// CheckSignature checks a card's response to SignAPDU(msg): status
// 90 00, and a signature that verifies against ccid.TestKey. It returns
// the signature.
func CheckSignature(msg, response []byte) ([]byte, error) {
	if len(response) < 2 || !bytes.HasSuffix(response, []byte{0x90, 0x00}) {
		return nil, fmt.Errorf("sign: the card answered %x", response)
	}
	sig := response[:len(response)-2]
	digest := sha256.Sum256(msg)
	if !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig) {
		return nil, fmt.Errorf("the card's signature %x does not verify", sig)
	}
	return sig, nil
}
