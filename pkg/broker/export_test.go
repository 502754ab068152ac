package broker

import (
	"os"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// NewUnprivilegedServer is NewServer for the tests of the broker's
// decisions without root: bind binds a lease's sockets instead of
// xsk.Bind (which needs CAP_NET_RAW), and the allocations' directories
// stay the test's user's instead of going to root.
func NewUnprivilegedServer(cfg Config, dp Datapath, bind func(dev xsk.Netdev, memfd int, queues []uint32, cfg xsk.Config) ([]xsk.Bound, error)) *Server {
	s := NewServer(cfg, dp)
	s.bind = bind
	s.dirUID = os.Geteuid()
	return s
}
