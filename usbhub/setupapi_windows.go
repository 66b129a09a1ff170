package usbhub

import (
	"errors"

	"golang.org/x/sys/windows"
)

// NewWindows reads the box's USB devices through SetupAPI.
func NewWindows() Windows { return Windows{src: setupAPI{}} }

// setupAPI lists present devices of the USB enumerator.
type setupAPI struct{}

func (setupAPI) usbDevices() ([]winDevice, error) {
	set, err := windows.SetupDiGetClassDevsEx(nil, "USB", 0, windows.DIGCF_PRESENT|windows.DIGCF_ALLCLASSES, 0, "")
	if err != nil {
		return nil, err
	}
	defer set.Close()
	var out []winDevice
	for i := 0; ; i++ {
		data, err := set.EnumDeviceInfo(i)
		if errors.Is(err, windows.ERROR_NO_MORE_ITEMS) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		var d winDevice
		if d.InstanceID, err = set.DeviceInstanceID(data); err != nil {
			continue // gone while we read it
		}
		d.LocationPath = first(set.DeviceRegistryProperty(data, windows.SPDRP_LOCATION_PATHS))
		d.Manufacturer = first(set.DeviceRegistryProperty(data, windows.SPDRP_MFG))
		d.Description = first(set.DeviceRegistryProperty(data, windows.SPDRP_DEVICEDESC))
		d.Service = first(set.DeviceRegistryProperty(data, windows.SPDRP_SERVICE))
		out = append(out, d)
	}
}

// first is a string property, or the first of a multi-string one.
func first(v any, err error) string {
	if err != nil {
		return ""
	}
	switch s := v.(type) {
	case string:
		return s
	case []string:
		if len(s) > 0 {
			return s[0]
		}
	}
	return ""
}
