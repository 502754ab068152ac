// The allocation's socket: accepting connections, identifying the peer
// (its credentials and pod), admitting the owner and refusing the rest
// cheaply, and binding an allocation for any pod to the first that holds it.

package broker

import (
	"context"
	"errors"
	"maps"
	"net"
	"time"

	"github.com/xdpq/xdpq/pkg/wire"
)

// accept serves the allocation's socket until it closes. Errors such as
// EMFILE, ENFILE or ECONNABORTED leave the socket open: the loop backs off
// (5 ms doubling to 1 s, as net/http does) and goes on.
func (s *Server) accept(al *allocation) {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := al.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Error("accept; retrying", "allocation", al.id, "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-al.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		s.admit(c, al)
	}
}

// admit identifies the peer of a new connection at once. The owner gets a
// handshake slot; anyone else is told why it is refused, a few at a time,
// and closed; what is over either bound is closed at once. A flood of
// connections from others thus costs the owner nothing.
func (s *Server) admit(c *net.UnixConn, al *allocation) {
	peer, err := peerOf(c, s.cfg.ProcRoot)
	if err != nil {
		_ = c.Close() // refused; the reason is logged next
		s.warn(al, "peer not identified; connection closed", "err", err)
		return
	}
	p := al.policy()
	why := p.owner.check(peer)
	s.mu.Lock()
	full := s.open >= s.cfg.MaxConnections
	if !full {
		s.open++
	}
	s.mu.Unlock()
	if full {
		_ = c.Close() // refused; the reason is logged next
		s.warn(al, "too many connections in a handshake across the daemon; closed", "peer", peer.String(), "limit", s.cfg.MaxConnections)
		return
	}
	al.mu.Lock()
	admitted := false
	switch {
	case al.stopping:
	case why != nil && al.refusals < maxRefusals:
		al.refusals++
		admitted = true
	case why == nil && al.handshakes < s.cfg.MaxHandshakes:
		al.handshakes++
		admitted = true
	}
	if admitted {
		al.conns[c] = true
		s.wg.Add(1)
	}
	al.mu.Unlock()
	if !admitted {
		s.closeSlot()
		_ = c.Close() // refused; the reason is logged next
		if why != nil {
			s.refused(al, peer, wire.CodeForbidden, why.Error())
			s.warn(al, "refused", "peer", peer.String(), "reason", why, "answered", false)
		} else {
			s.warn(al, "too many connections in a handshake; closed", "peer", peer.String(), "limit", s.cfg.MaxHandshakes)
		}
		return
	}
	go func() {
		defer s.wg.Done()
		var l *lease
		if why != nil {
			s.refuseForeign(c, al, peer, why)
			s.closeSlot()
		} else {
			held := true
			release := func() {
				if held {
					held = false
					al.mu.Lock()
					al.handshakes--
					al.mu.Unlock()
					s.closeSlot()
				}
			}
			var err error
			l, err = s.serve(c, al, peer, release)
			release()
			if err != nil { // told, and logged, once the slot is free again
				s.fail(c, al, peer, err)
			}
		}
		_ = c.Close() // the handshake or lease is over; its outcome was logged
		al.mu.Lock()
		delete(al.conns, c)
		if why != nil {
			al.refusals--
		}
		al.mu.Unlock()
		if l != nil {
			s.end(al, l)
		}
	}()
}

// claim binds an allocation whose owner is any pod to the pod of its
// peer, if Config.ClaimPod says that pod holds it; else the peer is
// refused. Allocations with another owner pass.
func (s *Server) claim(al *allocation, peer Peer) error {
	if s.cfg.ClaimPod == nil || !al.policy().owner.AnyPod {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StepTimeout)
	defer cancel()
	if err := s.cfg.ClaimPod(ctx, al.id, peer.Pod); err != nil {
		return refuse(wire.CodeForbidden, "pod %s: %v", peer.Pod.PodUID, err)
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.owner.AnyPod {
		al.owner = Owner{PodUID: peer.Pod.PodUID}
		return nil
	}
	if err := al.owner.check(peer); err != nil { // another pod's claim came first
		return refuse(wire.CodeForbidden, "%v", err)
	}
	return nil
}

// closeSlot gives back a connection's place under MaxConnections.
func (s *Server) closeSlot() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

// warn logs a warning about a connection, at most one a second per
// allocation, with the count of those left out since.
func (s *Server) warn(al *allocation, msg string, args ...any) {
	al.mu.Lock()
	now := time.Now()
	quiet := now.Before(al.quietUntil)
	left := al.quietCount
	if quiet {
		al.quietCount++
	} else {
		al.quietUntil, al.quietCount = now.Add(time.Second), 0
	}
	al.mu.Unlock()
	if quiet {
		return
	}
	if left > 0 {
		args = append(args, "not_logged_before", left)
	}
	s.log.Warn(msg, append([]any{"allocation", al.id}, args...)...)
}

// refuseForeign tells a peer that is not the owner why, in the protocol
// its first message speaks, if it sends one soon.
func (s *Server) refuseForeign(c *net.UnixConn, al *allocation, peer Peer, why error) {
	s.refused(al, peer, wire.CodeForbidden, why.Error())
	s.warn(al, "refused", "peer", peer.String(), "reason", why)
	first, fds, err := s.recv(c, 1, min(s.cfg.StepTimeout, refuseWait))
	closeFDs(fds)
	if err != nil {
		return
	}
	// The answer to a refused peer is a courtesy: the refusal is logged
	// above, and a peer that cannot be told has gone.
	if first[0] == '/' {
		_ = s.sendDPDK(c, dpdkHostNak)
		return
	}
	pe := refuse(wire.CodeForbidden, "%v", why)
	_ = s.send(c, wire.Message{Type: wire.TypeError, Code: pe.Code, Reason: pe.Reason})
}

// Refusals returns how many connections the server refused since it was
// created, by the wire code of the refusal (wire.CodeForbidden for peers
// that are not the owner, answered or not).
func (s *Server) Refusals() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.refusals)
}

// refused counts a refusal and reports it to Config.OnRefuse.
func (s *Server) refused(al *allocation, peer Peer, code, reason string) {
	s.mu.Lock()
	s.refusals[code]++
	s.mu.Unlock()
	if s.cfg.OnRefuse != nil {
		s.cfg.OnRefuse(al.id, peer, code, reason)
	}
}
