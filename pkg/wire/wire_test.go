package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestParseMessage(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"type":"hello","version":1,"client":"x"}`, TypeHello, true},
		{`{"type":"hello","version":1,"client":"x","extra":1}`, TypeHello, false},
		{`{"type":"hello"} {"type":"hello"}`, TypeHello, false},
		{`{"type":"ready"}`, TypeHello, false},
		{`not json`, TypeHello, false},
		{``, TypeHello, false},
		{`{"type":"request","frame_size":2048,"rings":{"fill":64,"completion":64,"rx":64,"tx":0},"queues":[1]}`, TypeRequest, true},
		{`{"type":"request","queues":[-1]}`, TypeRequest, false},
		{`{"type":"resume","queues":[0,1]}`, TypeResume, true},
		{`{"type":"resume","queues":[0,1],"inodes":[5]}`, TypeResume, false},
		{`{"type":"welcome","busy_poll":{"timeout_us":50,"budget":64}}`, TypeWelcome, true},
		{strings.Repeat(" ", MaxMessage+1), TypeHello, false},
	} {
		_, err := ParseMessage([]byte(c.in), c.want)
		var pe *ProtocolError
		if (err == nil) != c.ok || (err != nil && !errors.As(err, &pe)) {
			t.Errorf("%.60q: %v, want ok=%v", c.in, err, c.ok)
		}
	}
}

// FuzzParseMessage: whatever the bytes, a message of the type asked for
// or a bad-message refusal, never a panic.
func FuzzParseMessage(f *testing.F) {
	f.Add([]byte(`{"type":"hello","version":1,"client":"xdpqperf"}`), TypeHello)
	f.Add([]byte(`{"type":"welcome","version":1,"allocation":"a","netdev":"eth1","queues":[8,9],"busy_poll":{"timeout_us":50,"budget":64}}`), TypeWelcome)
	f.Fuzz(func(t *testing.T, b []byte, want string) {
		m, err := ParseMessage(b, want)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != CodeBadMessage {
				t.Fatalf("error %v is not a bad-message refusal", err)
			}
			return
		}
		if m.Type != want {
			t.Fatalf("type %q, want %q", m.Type, want)
		}
		if m.BusyPoll != nil {
			_ = m.BusyPoll.Validate() // the fuzz asks only that it does not panic
		}
	})
}
