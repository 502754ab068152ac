package xsk

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Frame sizes the kernel accepts in aligned mode that xdpq supports.
const (
	FrameSize2K = 2048
	FrameSize4K = 4096
)

// requiredSeals are the seals a UMEM memfd must carry: neither side may
// resize it while the other has it mapped (a shrink would make the other
// side's accesses fault with SIGBUS).
const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// NewMemfd creates a memfd of size bytes for a UMEM, sealed against shrink
// and grow. With hugetlb the memory comes from the default huge page pool
// and size must be a multiple of the huge page size.
func NewMemfd(name string, size int64, hugetlb bool) (*os.File, error) {
	if size <= 0 {
		return nil, fmt.Errorf("memfd %q: size %d is not positive", name, size)
	}
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if hugetlb {
		flags |= unix.MFD_HUGETLB
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, size); err != nil {
		_ = f.Close() // a memfd never used: nothing to lose
		return nil, fmt.Errorf("memfd %q: set size %d: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, requiredSeals); err != nil {
		_ = f.Close() // a memfd never used: nothing to lose
		return nil, fmt.Errorf("memfd %q: seal: %w", name, err)
	}
	return f, nil
}

// CheckMemfd returns the size of fd after checking that it is sealed
// against shrink and grow. Anything else (a regular file, an unsealed memfd)
// is refused, because its owner could resize it under a mapping.
func CheckMemfd(fd int) (int64, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return 0, fmt.Errorf("umem fd is not a memfd that allows sealing")
		}
		return 0, fmt.Errorf("umem fd: read seals: %w", err)
	}
	if seals&requiredSeals != requiredSeals {
		return 0, fmt.Errorf("umem memfd is not sealed against shrink and grow (seals %#x, need %#x)", seals, requiredSeals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("umem memfd: stat: %w", err)
	}
	return st.Size, nil
}

// UMEMConfig is the layout of a UMEM: the memory is cut into frames of
// FrameSize bytes, and the kernel leaves Headroom bytes free in front of
// each received frame for the application.
type UMEMConfig struct {
	FrameSize uint32
	Headroom  uint32
}

// Validate checks the layout against a UMEM of size bytes.
func (c UMEMConfig) Validate(size int64) error {
	if c.FrameSize != FrameSize2K && c.FrameSize != FrameSize4K {
		return fmt.Errorf("frame size %d: must be %d or %d", c.FrameSize, FrameSize2K, FrameSize4K)
	}
	// The kernel keeps XDP_PACKET_HEADROOM in front of the data as well.
	if max := c.FrameSize/2 - unix.XDP_PACKET_HEADROOM; c.Headroom > max {
		return fmt.Errorf("headroom %d: at most %d with frame size %d", c.Headroom, max, c.FrameSize)
	}
	page := int64(os.Getpagesize())
	if size <= 0 || size%int64(c.FrameSize) != 0 || size%page != 0 {
		return fmt.Errorf("umem size %d: must be a positive multiple of the frame size %d and the page size %d", size, c.FrameSize, page)
	}
	if size/int64(c.FrameSize) > 1<<32-1 {
		return fmt.Errorf("umem size %d: too many frames", size)
	}
	return nil
}

// UMEM is this process's mapping of the memory that backs a UMEM. Frame
// addresses in descriptors are offsets into it.
type UMEM struct {
	mem []byte
	cfg UMEMConfig
}

// MapUMEM maps the memfd that backs a UMEM into this process. The memfd
// may be closed afterwards; the mapping keeps the memory.
func MapUMEM(memfd int, cfg UMEMConfig) (*UMEM, error) {
	size, err := CheckMemfd(memfd)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(size); err != nil {
		return nil, fmt.Errorf("umem: %w", err)
	}
	mem, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("umem: mmap %d bytes: %w", size, err)
	}
	return &UMEM{mem: mem, cfg: cfg}, nil
}

// Config returns the layout the UMEM was mapped with.
func (u *UMEM) Config() UMEMConfig { return u.cfg }

// Size returns the size of the UMEM in bytes.
func (u *UMEM) Size() int { return len(u.mem) }

// NumFrames returns how many frames the UMEM holds.
func (u *UMEM) NumFrames() int { return len(u.mem) / int(u.cfg.FrameSize) }

// FrameAddr returns the address of frame i, for the fill or TX ring.
func (u *UMEM) FrameAddr(i int) uint64 { return uint64(i) * uint64(u.cfg.FrameSize) }

// Bytes returns the n bytes at addr, or nil when they are not all inside
// the UMEM. The slice aliases the UMEM: it is valid while the frame is
// owned by the application.
func (u *UMEM) Bytes(addr uint64, n uint32) []byte {
	end := addr + uint64(n)
	if end < addr || end > uint64(len(u.mem)) {
		return nil
	}
	return u.mem[addr:end:end]
}

// FramesFor returns how many frames Scatter writes a packet of n bytes
// into: at least one.
func (u *UMEM) FramesFor(n int) int {
	fs := int(u.cfg.FrameSize)
	return max((n+fs-1)/fs, 1)
}

// Scatter writes packet into the frames at addrs, as many as it needs
// from the first (a frame takes up to FrameSize bytes from its start),
// appends their TX descriptors to descs, every one but the last marked
// Continues, and returns descs and how many frames it used. A packet that
// needs more than one frame is sent whole only by a socket bound with
// Config.MultiBuffer. It writes nothing and returns an error when addrs
// are too few, or one is not a frame's start inside the UMEM, or a frame
// it needs is given twice (a later chunk would overwrite an earlier one).
func (u *UMEM) Scatter(packet []byte, addrs []uint64, descs []Desc) ([]Desc, int, error) {
	fs := int(u.cfg.FrameSize)
	need := u.FramesFor(len(packet))
	if need > len(addrs) {
		return descs, 0, fmt.Errorf("umem: a %d-byte packet needs %d frames of %d bytes, %d given", len(packet), need, fs, len(addrs))
	}
	for i, a := range addrs[:need] {
		if a%uint64(fs) != 0 || u.Bytes(a, uint32(fs)) == nil {
			return descs, 0, fmt.Errorf("umem: address %#x is not the start of a frame of the umem", a)
		}
		// A packet takes a handful of frames: a quadratic look costs
		// less than a map.
		for j, b := range addrs[:i] {
			if a == b {
				return descs, 0, fmt.Errorf("umem: frame %#x is given twice (addresses %d and %d of a %d-byte packet's frames)", a, j, i, len(packet))
			}
		}
	}
	for i, a := range addrs[:need] {
		chunk := packet[i*fs : min((i+1)*fs, len(packet))]
		copy(u.Bytes(a, uint32(len(chunk))), chunk)
		d := Desc{Addr: a, Len: uint32(len(chunk))}
		if i < need-1 {
			d.Options = Continues
		}
		descs = append(descs, d)
	}
	return descs, need, nil
}

// Close unmaps the UMEM. Sockets using it must be closed first.
func (u *UMEM) Close() error {
	if u.mem == nil {
		return nil
	}
	err := unix.Munmap(u.mem)
	u.mem = nil
	return err
}
