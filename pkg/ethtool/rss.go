package ethtool

import (
	"errors"
	"fmt"
	"unsafe"
)

const (
	rxfhHeader       = 24         // struct ethtool_rxfh without rss_config
	rxfhContextAlloc = 0xffffffff // ETH_RXFH_CONTEXT_ALLOC
)

// rxfhCreate encodes ETHTOOL_SRSSH creating a context whose indirection
// table of size entries spreads over queues in turn.
func rxfhCreate(size uint32, queues []uint32) ([]byte, error) {
	if len(queues) == 0 || size == 0 {
		return nil, errors.New("rss context: no queues or no indirection table")
	}
	b := make([]byte, rxfhHeader+4*int(size))
	ne.PutUint32(b[0:], cmdSRSSH)
	ne.PutUint32(b[4:], rxfhContextAlloc)
	ne.PutUint32(b[8:], size)
	for i := range size {
		ne.PutUint32(b[rxfhHeader+4*int(i):], queues[int(i)%len(queues)])
	}
	return b, nil
}

// rxfhDelete encodes ETHTOOL_SRSSH deleting context ctx.
func rxfhDelete(ctx uint32) []byte {
	b := make([]byte, rxfhHeader)
	ne.PutUint32(b[0:], cmdSRSSH)
	ne.PutUint32(b[4:], ctx)
	return b
}

// CreateRSSContext creates an RSS context that spreads the flows steered
// to it over queues, and returns its id, for Rule.RSSContext.
func (h *Handle) CreateRSSContext(ifname string, queues []uint32) (uint32, error) {
	var q [rxfhHeader]byte
	ne.PutUint32(q[0:], cmdGRSSH)
	if err := h.do(ifname, unsafe.Pointer(&q[0]), "get rss sizes"); err != nil {
		return 0, err
	}
	b, err := rxfhCreate(ne.Uint32(q[8:]), queues)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", ifname, err)
	}
	if err := h.do(ifname, unsafe.Pointer(&b[0]), fmt.Sprintf("create rss context over queues %v", queues)); err != nil {
		return 0, err
	}
	return ne.Uint32(b[4:]), nil
}

// DeleteRSSContext deletes an RSS context.
func (h *Handle) DeleteRSSContext(ifname string, ctx uint32) error {
	b := rxfhDelete(ctx)
	return h.do(ifname, unsafe.Pointer(&b[0]), fmt.Sprintf("delete rss context %d", ctx))
}
