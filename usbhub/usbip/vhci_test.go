//go:build linux

package usbip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

const vhciHeader = "hub port sta spd dev      sockfd local_busid\n"

// vhciLine is a status line as vhci-hcd prints it.
func vhciLine(hub string, port, state int) string {
	if state == vdevUsed {
		return fmt.Sprintf("%s  %04d %03d %03d %08x %06d %s\n", hub, port, state, 2, 1<<16|7, 3, "3-"+strconv.Itoa(port+1))
	}
	return fmt.Sprintf("%s  %04d %03d 000 00000000 000000 0-0\n", hub, port, state)
}

// vhciStatus is a controller's status file: its hs ports from first, n
// of them, then as many ss ports; used lists the ports in use.
func vhciStatus(first, n int, used ...int) string {
	in := map[int]bool{}
	for _, p := range used {
		in[p] = true
	}
	s := vhciHeader
	for i, hub := range []string{"hs", "ss"} {
		for p := first + i*n; p < first+(i+1)*n; p++ {
			st := vdevFree
			if in[p] {
				st = vdevUsed
			}
			s += vhciLine(hub, p, st)
		}
	}
	return s
}

// fakeVHCI writes a directory imitating vhci_hcd.0 with these status
// files (status, status.1, …), and empty attach and detach files.
func fakeVHCI(t *testing.T, status ...string) VHCI {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"attach": "", "detach": ""}
	for i, s := range status {
		name := "status"
		if i > 0 {
			name += "." + strconv.Itoa(i)
		}
		files[name] = s
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return VHCI{Dir: dir}
}

func (v VHCI) written(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(v.Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// superKey is a key that says it is SuperSpeed, or what speed says.
type superKey struct {
	usbdev.Device
	speed usbdev.Speed
}

func (k superKey) Info() usbdev.Info {
	i := k.Device.Info()
	i.Speed = k.speed
	return i
}

func TestAttachVHCI(t *testing.T) {
	key := ccid.New(0x1050, 0x0407, "UK-000123")
	for _, tc := range []struct {
		name   string
		status []string
		dev    usbdev.Device
		busID  string
		port   int    // the port chosen, with speed the line's last field
		speed  int    // (0: the attach is refused, with kind and text)
		kind   error  // the refusal's kind
		says   string // and a word of its text
	}{
		{name: "first free hs port", status: []string{vhciStatus(0, 15, 0, 1, 3)}, dev: key, busID: "1-1", port: 2, speed: 2},
		{name: "on the next controller", status: []string{vhciStatus(0, 2, 0, 1), vhciStatus(4, 2, 4)}, dev: key, busID: "1-1", port: 5, speed: 2},
		{name: "SuperSpeed on the ss hub", status: []string{vhciStatus(0, 15, 15)}, dev: superKey{key, speedSuper}, busID: "1-1", port: 16, speed: 5},
		{name: "no vhci", dev: key, busID: "1-1", kind: errdefs.ErrUnavailable, says: "modprobe vhci-hcd"},
		{name: "no free port", status: []string{vhciStatus(0, 2, 0, 1, 2, 3)}, dev: key, busID: "1-1", kind: errdefs.ErrUnavailable, says: "in use"},
		{name: "only ss ports free", status: []string{vhciStatus(0, 2, 0, 1)}, dev: key, busID: "1-1", kind: errdefs.ErrUnavailable, says: "high-speed"},
		{name: "not offered", status: []string{vhciStatus(0, 2)}, dev: key, busID: "9-9", kind: errdefs.ErrUnavailable, says: "does not offer 9-9"},
		{name: "SuperSpeed+", status: []string{vhciStatus(0, 2)}, dev: superKey{key, 6}, busID: "1-1", kind: errdefs.ErrInvalid, says: "speed 6"},
		{name: "speed unknown", status: []string{vhciStatus(0, 2)}, dev: superKey{key, 0}, busID: "1-1", kind: errdefs.ErrInvalid, says: "speed 0"},
		{name: "bad status", status: []string{vhciHeader + "hs  0000 004 000 00000000 000000\n"}, dev: key, busID: "1-1", kind: errdefs.ErrInvalid, says: "6 fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, addr := serveDevice(t, tc.dev, 0)
			v := fakeVHCI(t, tc.status...)
			if tc.status == nil {
				v.Dir = filepath.Join(v.Dir, "absent")
			}
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			port, err := v.Attach(ctx, conn, tc.busID)
			if tc.speed == 0 {
				if err == nil || !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("attach: port %d, %v; want a refusal of kind %v saying %q", port, err, tc.kind, tc.says)
				}
				if tc.status != nil {
					if got := v.written(t, "attach"); got != "" {
						t.Errorf("a refused attach wrote %q", got)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("attach: %v", err)
				}
				f := strings.Fields(v.written(t, "attach"))
				if port != tc.port || len(f) != 4 || f[0] != strconv.Itoa(tc.port) || f[2] != strconv.Itoa(busnum<<16|1) || f[3] != strconv.Itoa(tc.speed) {
					t.Fatalf("attach: port %d, wrote %q; want port %d, \"%d SOCKFD %d %d\"", port, f, tc.port, tc.port, busnum<<16|1, tc.speed)
				}
				if fd, err := strconv.Atoi(f[1]); err != nil || fd < 3 {
					t.Errorf("attach wrote sockfd %q", f[1])
				}
			}
			if _, err := conn.Write([]byte{0}); err == nil {
				t.Error("Attach left conn open")
			}
			// The device is free again on its server: the connection
			// ended (here no kernel holds it).
			waitFree(t, s, addr)
		})
	}
}

// waitFree waits until a client can import 1-1 from the server at addr.
func waitFree(t *testing.T, s *Server, addr string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Import(t.Context(), conn, "1-1")
		if err == nil {
			c.Close()
			return
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the device stayed taken: %v", err)
		}
	}
}

func TestAttachVHCINeedsTCP(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer b.Close()
	if _, err := fakeVHCI(t, vhciStatus(0, 2)).Attach(t.Context(), a, "1-1"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("attach on a pipe: %v", err)
	}
	if _, err := a.Write([]byte{0}); err == nil {
		t.Error("Attach left conn open")
	}
}

func TestDetachVHCI(t *testing.T) {
	t.Parallel()
	v := fakeVHCI(t, vhciStatus(0, 2, 1))
	if err := v.Detach(1); err != nil {
		t.Fatal(err)
	}
	if got := v.written(t, "detach"); got != "1" {
		t.Fatalf("detach wrote %q", got)
	}
	for _, port := range []int{-1, maxVHCIPorts} {
		if err := v.Detach(port); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("detach %d: %v", port, err)
		}
	}
	if err := (VHCI{Dir: filepath.Join(v.Dir, "absent")}).Detach(1); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "modprobe vhci-hcd") {
		t.Errorf("detach without vhci: %v", err)
	}
}

func TestVHCIPorts(t *testing.T) {
	t.Parallel()
	v := fakeVHCI(t, vhciStatus(0, 2, 1),
		vhciHeader+vhciLine("hs", 4, vdevNotAssigned)+vhciLine("hs", 5, vdevError)+vhciLine("ss", 6, vdevFree)+vhciLine("ss", 7, vdevFree))
	ports, err := v.Ports()
	if err != nil {
		t.Fatal(err)
	}
	want := []VHCIPort{{Port: 0, Free: true}, {Port: 1, Speed: 2, DevID: 1<<16 | 7, BusID: "3-2"}, {Port: 2, Super: true, Free: true}, {Port: 3, Super: true, Free: true},
		{Port: 4}, {Port: 5}, {Port: 6, Super: true, Free: true}, {Port: 7, Super: true, Free: true}}
	if fmt.Sprint(ports) != fmt.Sprint(want) {
		t.Fatalf("ports\n%v, want\n%v", ports, want)
	}
	if p, err := v.Port(1); err != nil || p.BusID != "3-2" {
		t.Fatalf("port 1: %+v %v", p, err)
	}
	if _, err := v.Port(9); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("port 9: %v", err)
	}
}

// badStatuses are status files Ports refuses; the fuzz target starts
// from them.
var badStatuses = []string{
	"",
	"port sta\n",
	vhciHeader + "hs  0000 004 000 00000000 000000\n",
	vhciHeader + "xs  0000 004 000 00000000 000000 0-0\n",
	vhciHeader + "hs  9999 004 000 00000000 000000 0-0\n",
	vhciHeader + "hs  -001 004 000 00000000 000000 0-0\n",
	vhciHeader + "hs  0000 009 000 00000000 000000 0-0\n",
	vhciHeader + "hs  0000 006 999 00000000 000000 0-0\n",
	vhciHeader + "hs  0000 006 002 0000000g 000000 0-0\n",
	vhciHeader + "hs  0000 006 002 100000000 000000 0-0\n",
	vhciHeader + "hs  0000 006 002 00000001 00000x 0-0\n",
	vhciHeader + "hs  0000 006 002 00000001 000003 ../../etc\n",
	vhciHeader + "hs  0000 006 002 00000001 000003 " + strings.Repeat("1", 40) + "\n",
	vhciHeader + vhciLine("hs", 0, vdevFree) + vhciLine("hs", 0, vdevFree),
	vhciHeader + vhciLine("hs", 0, vdevFree) + "\n",
	vhciHeader + strings.Repeat(vhciLine("hs", 0, vdevFree), maxVHCIStatus/40),
}

func TestVHCIPortsRefuses(t *testing.T) {
	t.Parallel()
	for i, s := range badStatuses {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			if ports, err := fakeVHCI(t, s).Ports(); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("%q: %v, %v", s, ports, err)
			}
		})
	}
	// A port on two controllers.
	if _, err := fakeVHCI(t, vhciStatus(0, 2), vhciStatus(2, 2)).Ports(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a port listed twice: %v", err)
	}
}

// FuzzVHCIStatus: any status file is read without panic, and what is
// read is within bounds.
func FuzzVHCIStatus(f *testing.F) {
	f.Add(vhciStatus(0, 15, 1, 16))
	for _, s := range badStatuses {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ports, err := parseVHCIStatus([]byte(s))
		if err != nil {
			return
		}
		for _, p := range ports {
			if p.Port < 0 || p.Port >= maxVHCIPorts || len(p.BusID) >= busIDSize || strings.Contains(p.BusID, "/") || (p.Free && p.BusID != "") {
				t.Fatalf("%q gave %+v", s, p)
			}
		}
	})
}
