package broker

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/xdpq/xdpq/pkg/wire"
)

// The AF_XDP device plugin handshake of DPDK's af_xdp PMD (use_cni) and
// CNDP: ASCII commands without terminator, one per SOCK_SEQPACKET message.
const (
	dpdkConnect    = "/connect"
	dpdkHostOK     = "/host_ok"
	dpdkHostNak    = "/host_nak"
	dpdkVersion    = "/version"
	dpdkVersionAns = "0.1"
	dpdkXSKMapFD   = "/xsk_map_fd"
	dpdkFDAck      = "/fd_ack"
	dpdkFDNak      = "/fd_nak"
	dpdkBusyPoll   = "/config_busy_poll"
	dpdkBusyAck    = "/config_busy_poll_ack"
	dpdkBusyNak    = "/config_busy_poll_nak"
	dpdkFin        = "/fin"
	dpdkFinAck     = "/fin_ack"
	dpdkNak        = "/nak"
	// dpdkMaxCommand is DPDK's UDS_MAX_CMD_LEN with room to spare.
	dpdkMaxCommand = 128
)

// dpdkCommand is one parsed command.
type dpdkCommand struct {
	name string   // e.g. "/xsk_map_fd"
	args []string // the comma-separated arguments
}

// parseDPDKCommand parses "/name[,arg...]". It accepts a trailing NUL or
// newline, which some clients send.
func parseDPDKCommand(b []byte) (dpdkCommand, error) {
	b = bytes.TrimRight(b, "\x00\n")
	if len(b) == 0 || len(b) > dpdkMaxCommand || b[0] != '/' {
		return dpdkCommand{}, fmt.Errorf("not a device plugin command (%d bytes)", len(b))
	}
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return dpdkCommand{}, fmt.Errorf("command has a non-printable byte %#x", c)
		}
	}
	parts := strings.Split(string(b), ",")
	return dpdkCommand{name: parts[0], args: parts[1:]}, nil
}

// busyPollArgs parses the arguments of /config_busy_poll: timeout (µs)
// and budget, both positive.
func busyPollArgs(args []string) (timeout, budget int, err error) {
	if len(args) != 2 {
		return 0, 0, fmt.Errorf("want timeout and budget, got %d arguments", len(args))
	}
	if timeout, err = strconv.Atoi(args[0]); err != nil || timeout <= 0 || timeout > wire.MaxBusyPollTimeout {
		return 0, 0, fmt.Errorf("busy poll timeout %q: want 1..%d µs", args[0], wire.MaxBusyPollTimeout)
	}
	if budget, err = strconv.Atoi(args[1]); err != nil || budget <= 0 || budget > wire.MaxBusyPollBudget {
		return 0, 0, fmt.Errorf("busy poll budget %q: want 1..%d", args[1], wire.MaxBusyPollBudget)
	}
	return timeout, budget, nil
}
