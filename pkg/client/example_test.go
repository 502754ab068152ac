package client_test

import (
	"context"
	"log"
	"time"

	"github.com/xdpq/xdpq/pkg/client"
)

// A pod's receive loop: the sockets from $XDPQ_SOCKET, a goroutine per
// queue, each handing its frames to handle until ctx ends.
func ExampleLease_Receiver() {
	ctx := context.Background() // yours: cancelled on SIGTERM, say
	handle := func(queue uint32, frame []byte) {}

	l, err := client.ConnectContext(ctx, "", client.Options{Name: "myapp"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, len(l.Sockets))
	for i, q := range l.Queues {
		go func() {
			r := l.Receiver(i)
			for ctx.Err() == nil {
				// Wait up to 100 ms for frames: ctx is looked at that often.
				if _, err := r.Receive(100*time.Millisecond, func(frame []byte) { handle(q, frame) }); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range l.Sockets {
		if err := <-done; err != nil {
			log.Print(err)
		}
	}
}

// A pod's receive loop on one core: one loop over all its queues.
func ExampleLease_Poller() {
	ctx := context.Background() // yours: cancelled on SIGTERM, say
	handle := func(queue uint32, frame []byte) {}

	l, err := client.ConnectContext(ctx, "", client.Options{Name: "myapp"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	p := l.Poller() // all the lease's sockets
	for ctx.Err() == nil {
		// Wait up to 100 ms for frames: ctx is looked at that often.
		if _, err := p.Receive(100*time.Millisecond, func(socket int, frame []byte) { handle(l.Queues[socket], frame) }); err != nil {
			log.Print(err)
			return
		}
	}
}
