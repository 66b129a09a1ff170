package usbhub

import (
	"strings"
	"testing"
)

func TestParseUevent(t *testing.T) {
	t.Parallel()
	msg := "add@/devices/pci0000:00/0000:00:14.0/usb1/1-2\x00ACTION=add\x00DEVPATH=/devices/pci0000:00/0000:00:14.0/usb1/1-2\x00SUBSYSTEM=usb\x00DEVTYPE=usb_device\x00PRODUCT=96e/702/100\x00BUSNUM=001\x00DEVNUM=005\x00SEQNUM=4711\x00"
	u, err := ParseUevent([]byte(msg))
	if err != nil || u.Action != "add" || !u.IsUSBDevice() || u.Vars["DEVNUM"] != "005" {
		t.Fatalf("%+v %v", u, err)
	}
	iface := strings.Replace(msg, "DEVTYPE=usb_device", "DEVTYPE=usb_interface", 1)
	if u, _ := ParseUevent([]byte(iface)); u.IsUSBDevice() {
		t.Error("an interface taken for a device")
	}
	for _, bad := range []string{"", "libudev\x00\xfe\xed", "add", "add@relative\x00", "@/x", strings.Repeat("a", 9000),
		"add@/x\x00ACTION=remove\x00"} {
		if _, err := ParseUevent([]byte(bad)); err == nil {
			t.Errorf("ParseUevent(%q) accepted", bad[:min(len(bad), 30)])
		}
	}
}

func FuzzParseUevent(f *testing.F) {
	f.Add([]byte("add@/devices/usb1/1-2\x00ACTION=add\x00SUBSYSTEM=usb\x00DEVTYPE=usb_device\x00"))
	f.Add([]byte("remove@/x\x00=\x00k\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUevent(b)
		if err == nil && (u.Action == "" || !strings.HasPrefix(u.DevPath, "/")) {
			t.Fatalf("accepted %q as %+v", b, u)
		}
	})
}
