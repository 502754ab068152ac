package xsk

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

func setsockoptInt(fd, opt, v int) error {
	return unix.SetsockoptInt(fd, unix.SOL_XDP, opt, v)
}

func setsockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// getsockopt reads a SOL_XDP option of exactly size bytes.
func getsockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	n := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	if uintptr(n) != size {
		return fmt.Errorf("kernel returned %d bytes, want %d", n, size)
	}
	return nil
}

func mmapOffsets(fd int) (unix.XDPMmapOffsets, error) {
	var off unix.XDPMmapOffsets
	err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off))
	return off, err
}

// kickTX wakes the kernel to transmit what the TX ring holds (sendto).
func kickTX(fd int) error { return wakeup(unix.SYS_SENDTO, fd) }

// closeFDs closes the descriptors of sockets or memfds given up on an
// error path. Linux frees a descriptor even when close reports an error,
// and nothing was written through these that could be lost: there is
// nothing to retry or report beyond the error that led here.
func closeFDs(fds ...int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// kickRX wakes the kernel to process the fill ring (recvfrom).
func kickRX(fd int) error { return wakeup(unix.SYS_RECVFROM, fd) }

// wakeup makes the empty, non-blocking sendto or recvfrom that wakes an
// AF_XDP socket. The errors the kernel returns for a transient condition
// (ring full, device busy or down) are not errors here.
func wakeup(nr uintptr, fd int) error {
	_, _, errno := unix.Syscall6(nr, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	switch errno {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.ENETDOWN:
		return nil
	}
	return errno
}
