// The server's side of DPDK's af_xdp handshake (dpdk.go parses it):
// the XSKMAP and busy-poll commands of the PMD's use_cni mode.

package broker

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// sendDPDK sends a line of the DPDK protocol, with fds.
func (s *Server) sendDPDK(c *net.UnixConn, text string, fds ...int) error {
	if err := c.SetWriteDeadline(time.Now().Add(s.cfg.StepTimeout)); err != nil {
		return err
	}
	return xsk.SendFDs(c, []byte(text), fds)
}

func (s *Server) dpdk(c *net.UnixConn, al *allocation, peer Peer, msg []byte, fds []int) {
	connected := false
	reply := func(text string, fds ...int) bool {
		return s.sendDPDK(c, text, fds...) == nil
	}
	for {
		cmd, err := parseDPDKCommand(msg)
		var ok bool
		switch {
		case err != nil:
			ok = reply(dpdkNak)
		case cmd.name == dpdkConnect:
			// The peer was found to be the owner when it connected.
			connected = true
			ok = reply(dpdkHostOK)
		case cmd.name == dpdkVersion:
			ok = reply(dpdkVersionAns)
		case cmd.name == dpdkXSKMapFD:
			fd, why := s.xskMap(connected, cmd, al.policy())
			if why != nil {
				s.log.Warn("xskmap refused", "allocation", al.id, "peer", peer.String(), "protocol", "dpdk", "reason", why)
				ok = reply(dpdkFDNak)
				break
			}
			ok = reply(dpdkFDAck, fd)
			closeFDs([]int{fd}) // the peer has its own copy, or is gone
		case cmd.name == dpdkBusyPoll:
			ans, why := s.busyPoll(connected, cmd, fds, al.policy().busyPoll)
			if why != nil {
				s.log.Warn("busy poll refused", "allocation", al.id, "peer", peer.String(), "protocol", "dpdk", "reason", why)
			}
			ok = reply(ans)
		case cmd.name == dpdkFin:
			reply(dpdkFinAck)
			closeFDs(fds)
			return
		default:
			ok = reply(dpdkNak)
		}
		closeFDs(fds)
		if !ok {
			return
		}
		if msg, fds, err = s.recv(c, 1, s.cfg.StepTimeout); err != nil {
			return
		}
	}
}

// xskMap returns a descriptor of the XSKMAP of the allocation's netdev
// when the netdev is the allocation's alone; the reason otherwise (the
// DPDK handshake can only say /fd_nak: the log says why).
func (s *Server) xskMap(connected bool, cmd dpdkCommand, p policy) (int, error) {
	switch {
	case !connected:
		return -1, errors.New("not connected")
	case len(cmd.args) != 1:
		return -1, fmt.Errorf("want one argument, the netdev; got %d", len(cmd.args))
	case p.own == nil:
		return -1, fmt.Errorf("the XSKMAP of %s is shared with other allocations and never leaves the daemon: "+
			"for DPDK's af_xdp driver use a netdev-mode pool (the netdev is moved into the pod), "+
			"or receive bound sockets with the xdpq client (no capability needed)", p.dev.Name)
	case cmd.args[0] != p.dev.Name:
		return -1, fmt.Errorf("netdev %q is not the allocation's; it has %s", cmd.args[0], p.dev.Name)
	}
	fd, err := p.own.XSKMapFD()
	if err != nil {
		return -1, fmt.Errorf("xskmap of %s: %w", p.dev.Name, err)
	}
	return fd, nil
}

// busyPoll configures preferred busy polling on the AF_XDP socket the
// client sent, which it may not do itself without CAP_NET_ADMIN, within
// the allocation's setting: none at all when it has none.
func (s *Server) busyPoll(connected bool, cmd dpdkCommand, fds []int, limit *wire.BusyPoll) (string, error) {
	timeout, budget, err := busyPollArgs(cmd.args)
	switch {
	case !connected:
		return dpdkBusyNak, errors.New("not connected")
	case err != nil:
		return dpdkBusyNak, err
	case len(fds) != 1:
		return dpdkBusyNak, fmt.Errorf("%d descriptors; want the AF_XDP socket", len(fds))
	case limit == nil:
		return dpdkBusyNak, errors.New("the pool has no busy polling")
	case timeout > limit.TimeoutMicros || budget > limit.Budget:
		return dpdkBusyNak, fmt.Errorf("timeout %d µs, budget %d; the pool allows at most %d µs, %d", timeout, budget, limit.TimeoutMicros, limit.Budget)
	}
	if _, err := xdpSocketInode(fds[0]); err != nil {
		return dpdkBusyNak, err
	}
	if err := setBusyPoll(fds[0], &wire.BusyPoll{TimeoutMicros: timeout, Budget: budget}); err != nil {
		return dpdkBusyNak, err
	}
	return dpdkBusyAck, nil
}
