package xsk

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Desc is an RX or TX descriptor: a frame at Addr in the UMEM, Len bytes
// long. Its layout is the kernel's struct xdp_desc.
type Desc struct {
	Addr    uint64
	Len     uint32
	Options uint32
}

// Continues is the Options bit (XDP_PKT_CONTD) of a descriptor that a
// packet's next descriptor continues: on a socket bound with
// Config.MultiBuffer, a packet larger than a UMEM frame is received in
// several descriptors in a row, every one but the last with Continues,
// and is sent the same way.
const Continues = unix.XDP_PKT_CONTD

// Continues reports whether the packet goes on in the next descriptor.
func (d Desc) Continues() bool { return d.Options&Continues != 0 }

// Gather joins the descriptors of a packet received in several (a
// socket bound with Config.MultiBuffer) into one buffer of its own.
type Gather struct {
	buf  []byte
	more bool
}

// Add takes the next descriptor received and its bytes b. Once d ends a
// packet it returns the whole packet and true: b itself for a packet in
// one descriptor, else the gathered bytes, valid until the next Add.
// While the packet goes on it returns false.
func (g *Gather) Add(d Desc, b []byte) ([]byte, bool) {
	if !g.more && !d.Continues() {
		return b, true
	}
	g.buf = append(g.buf, b...)
	if g.more = d.Continues(); g.more {
		return nil, false
	}
	p := g.buf
	g.buf = g.buf[:0]
	return p, true
}

// ring is one of the four single-producer single-consumer rings shared with
// the kernel. The application produces on the fill and TX rings and
// consumes on the RX and completion rings. The cached indexes spare an
// atomic load of the other side's index on most calls, as in libbpf.
type ring[T uint64 | Desc] struct {
	mem        []byte
	producer   *uint32
	consumer   *uint32
	flags      *uint32
	entries    []T
	mask       uint32
	size       uint32
	cachedProd uint32
	cachedCons uint32
}

func mapRing[T uint64 | Desc](fd int, pgoff int64, off unix.XDPRingOffset, n uint32, producer bool) (*ring[T], error) {
	var zero T
	length := off.Desc + uint64(n)*uint64(unsafe.Sizeof(zero))
	mem, err := unix.Mmap(fd, pgoff, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	if off.Producer+4 > length || off.Consumer+4 > length || off.Flags+4 > length {
		_ = unix.Munmap(mem) // fails only for a bad address; the error below is the one to tell
		return nil, fmt.Errorf("ring offsets %+v outside the %d-byte mapping", off, length)
	}
	r := &ring[T]{
		mem:      mem,
		producer: (*uint32)(unsafe.Pointer(&mem[off.Producer])),
		consumer: (*uint32)(unsafe.Pointer(&mem[off.Consumer])),
		flags:    (*uint32)(unsafe.Pointer(&mem[off.Flags])),
		entries:  unsafe.Slice((*T)(unsafe.Pointer(&mem[off.Desc])), n),
		mask:     n - 1,
		size:     n,
	}
	r.cachedProd = atomic.LoadUint32(r.producer)
	r.cachedCons = atomic.LoadUint32(r.consumer)
	if producer {
		r.cachedCons += n
	}
	return r, nil
}

func (r *ring[T]) unmap() {
	if r != nil && r.mem != nil {
		_ = unix.Munmap(r.mem) // fails only for a bad address, and the socket's close frees the ring
		r.mem = nil
	}
}

// free returns how many entries the producer may write, reloading the
// consumer index only when the cached view is short of n.
func (r *ring[T]) free(n uint32) uint32 {
	if f := r.cachedCons - r.cachedProd; f >= n {
		return f
	}
	r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
	return r.cachedCons - r.cachedProd
}

// produce writes up to len(src) entries and publishes them with one store.
func (r *ring[T]) produce(src []T) int {
	n := min(r.free(uint32(len(src))), uint32(len(src)))
	if n == 0 {
		return 0
	}
	for i := uint32(0); i < n; i++ {
		r.entries[(r.cachedProd+i)&r.mask] = src[i]
	}
	r.cachedProd += n
	atomic.StoreUint32(r.producer, r.cachedProd)
	return int(n)
}

// avail returns how many entries the consumer may read, at most n.
func (r *ring[T]) avail(n uint32) uint32 {
	e := r.cachedProd - r.cachedCons
	if e == 0 {
		r.cachedProd = atomic.LoadUint32(r.producer)
		e = r.cachedProd - r.cachedCons
	}
	return min(e, n)
}

// consume copies up to len(dst) entries out and releases them with one store.
func (r *ring[T]) consume(dst []T) int {
	n := r.avail(uint32(len(dst)))
	if n == 0 {
		return 0
	}
	for i := uint32(0); i < n; i++ {
		dst[i] = r.entries[(r.cachedCons+i)&r.mask]
	}
	r.cachedCons += n
	atomic.StoreUint32(r.consumer, r.cachedCons)
	return int(n)
}

// pending returns how many produced entries the kernel has not consumed.
func (r *ring[T]) pending() uint32 {
	return r.cachedProd - atomic.LoadUint32(r.consumer)
}

func (r *ring[T]) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}
