package usbip

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// TestResumeWire: the new operations' parsers take what they may, and
// refuse the rest.
func TestResumeWire(t *testing.T) {
	t.Parallel()
	for _, tc := range resumeCases() {
		t.Run(tc.name, func(t *testing.T) {
			_, waiting, err := readResumeRequest(bytes.NewReader(tc.request[opHeaderSize:]))
			if (err == nil) != tc.ok {
				t.Fatalf("request %x: %v %v", tc.request, waiting, err)
			}
		})
	}
	states := []uint32{resumeAnswered, resumeResubmit, resumeLost}
	b := appendResumeStates(nil, []uint32{7, 8, 9}, states)
	if got, err := readResumeStates(bytes.NewReader(b), []uint32{7, 8, 9}); err != nil || len(got) != 3 || got[2] != resumeLost {
		t.Fatalf("states %v %v", got, err)
	}
	for name, w := range map[string][]uint32{"other seqnums": {7, 8, 10}, "fewer": {7, 8}, "more": {7, 8, 9, 10}} {
		if _, err := readResumeStates(bytes.NewReader(b), w); err == nil {
			t.Errorf("states for %s taken", name)
		}
	}
	if _, err := readResumeStates(bytes.NewReader(appendResumeStates(nil, []uint32{7}, []uint32{3})), []uint32{7}); err == nil {
		t.Error("an unknown state taken")
	}
}

type resumeCase struct {
	name    string
	request []byte
	ok      bool
}

func resumeCases() []resumeCase {
	var id sessionID
	many := make([]uint32, maxInFlight+1)
	for i := range many {
		many[i] = uint32(i + 1)
	}
	huge := appendResumeRequest(nil, id, nil)
	binary.BigEndian.PutUint32(huge[len(huge)-4:], 0xffffffff)
	return []resumeCase{
		{"none waiting", appendResumeRequest(nil, id, nil), true},
		{"some", appendResumeRequest(nil, id, []uint32{3, 4, 0xffffffff}), true},
		{"as many as may be in flight", appendResumeRequest(nil, id, many[:maxInFlight]), true},
		{"more", appendResumeRequest(nil, id, many), false},
		{"a count of 4G", huge, false},
		{"one twice", appendResumeRequest(nil, id, []uint32{3, 4, 3}), false},
		{"truncated", appendResumeRequest(nil, id, []uint32{3, 4})[:opHeaderSize+sessionIDSize+4+6], false},
	}
}

// FuzzResumeServer: whatever a client sends, a resume of a held session
// among it, ends its connection or is answered; nothing panics or hangs,
// and Close ends the session.
func FuzzResumeServer(f *testing.F) {
	id := sessionID{1, 2, 3}
	for _, tc := range resumeCases() {
		f.Add(tc.request)
		req := append([]byte{}, tc.request...)
		copy(req[opHeaderSize:], id[:])
		f.Add(req)
	}
	sub := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	sub = binary.BigEndian.AppendUint32(sub, 2)
	sub = append(sub, make([]byte, 4)...)
	sub = binary.BigEndian.AppendUint32(sub, dirIn)
	sub = binary.BigEndian.AppendUint32(sub, 3) // interrupt: it waits
	sub = append(sub, make([]byte, 4)...)
	sub = binary.BigEndian.AppendUint32(sub, 8)
	sub = append(sub, make([]byte, 20)...)
	f.Add(append(appendResumeRequest(nil, id, []uint32{1}), sub...))
	f.Add(append(append(appendResumeRequest(nil, id, nil), sub...), sub...))
	f.Add(append(appendResumeRequest(nil, id, nil), append(binary.BigEndian.AppendUint32(nil, cmdRelease), make([]byte, 44)...)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := New(quiet())
		s.ResumeWindow = time.Hour
		s.Add("1-1", ccid.New(1, 2, "x"))
		serve := func(in []byte) {
			a, b := net.Pipe()
			done := make(chan struct{})
			go func() {
				defer close(done)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				s.ServeConn(ctx, a)
			}()
			go io.Copy(io.Discard, b)
			b.Write(in)
			b.Close()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the server did not let go of a client that left")
			}
		}
		// A session held: its client imported the key, sent an
		// interrupt read (seqnum 1), and went.
		first := append(append(appendFixed(appendOpHeader(nil, opReqImportResumable, 0), "1-1", busIDSize), id[:]...), sub...)
		binary.BigEndian.PutUint32(first[len(first)-urbHeaderSize+4:], 1)
		serve(first)
		serve(in)
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end a held session")
		}
	})
}

// FuzzResumeClient: whatever a server sends after a resumable import,
// and in answer to a resume, a Remote's transfers end and nothing
// panics or hangs. The input's first byte says where the first
// connection ends.
func FuzzResumeClient(f *testing.F) {
	ret := binary.BigEndian.AppendUint32(nil, retSubmit)
	ret = binary.BigEndian.AppendUint32(ret, 1)
	ret = append(ret, make([]byte, 12)...)
	ret = binary.BigEndian.AppendUint32(ret, 0)
	ret = binary.BigEndian.AppendUint32(ret, 4)
	ret = append(append(ret, make([]byte, 20)...), 1, 2, 3, 4)
	dev := appendDevice(nil, "1-1", busnum, 1, usbdev.Info{Vendor: 1, Product: 2}, false)
	resumed := func(state uint32) []byte {
		return appendResumeStates(append(appendOpHeader(nil, opRepResume, stOK), dev...), []uint32{1}, []uint32{state})
	}
	f.Add(append([]byte{0}, append(resumed(resumeAnswered), ret...)...))
	f.Add(append([]byte{byte(len(ret))}, append(ret, resumed(resumeAnswered)...)...))
	f.Add(append([]byte{0}, resumed(resumeResubmit)...))
	f.Add(append([]byte{0}, resumed(resumeLost)...))
	f.Add(append([]byte{0}, appendOpHeader(nil, opRepResume, stNoSession)...))
	f.Add(append([]byte{0}, appendResumeStates(append(appendOpHeader(nil, opRepResume, stOK), dev...), []uint32{1, 2}, []uint32{0, 0})...))
	f.Fuzz(fuzzResumeClient)
}

// fuzzResumeClient is FuzzResumeClient's body: a fake server answers
// the import and the first transfer's URB with the input up to its cut,
// and the resume with the rest.
func fuzzResumeClient(t *testing.T, in []byte) {
	if len(in) == 0 {
		return
	}
	dev := appendDevice(nil, "1-1", busnum, 1, usbdev.Info{Vendor: 1, Product: 2}, false)
	cut := min(int(in[0]), len(in)-1)
	streams := [][]byte{in[1 : 1+cut], in[1+cut:]}
	var mu sync.Mutex
	dials := 0
	dial := func(ctx context.Context) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if dials == len(streams) {
			return nil, errors.New("no more")
		}
		a, b := net.Pipe()
		first, out := dials == 0, streams[dials]
		dials++
		go func() {
			defer b.Close()
			if first {
				io.ReadFull(b, make([]byte, opHeaderSize+busIDSize+sessionIDSize))
				b.Write(append(appendOpHeader(nil, opRepImportResumable, stOK), dev...))
				io.ReadFull(b, make([]byte, urbHeaderSize)) // the transfer's URB
			} else {
				h := make([]byte, opHeaderSize+sessionIDSize+4)
				io.ReadFull(b, h)
				io.ReadFull(b, make([]byte, 4*int(min(be32(h[len(h)-4:]), maxInFlight))))
			}
			go io.Copy(io.Discard, b)
			b.Write(out)
		}()
		return a, nil
	}
	r, err := ImportResumable(context.Background(), dial, "1-1", 100*time.Millisecond, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r.Transfer(ctx, 0x82, nil, 64)
	r.Close()
}
