package usbhub

import "golang.org/x/sys/unix"

// mknodNull makes path a character device node that behaves as /dev/null
// (1:3), mode 0660, owned by root. It fails without the right to.
func mknodNull(path string) error {
	if err := unix.Mknod(path, unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil {
		return err
	}
	// The umask may have taken group bits.
	return unix.Chmod(path, 0o660)
}
