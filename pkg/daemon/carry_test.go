package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestCarry: what kubelet's Allocate for a restarted container carries
// over of the old allocation's attachments: those on the same netdev and
// queues whose pod's network namespace is still the one ADD saw. (A file
// stands for the namespace: carry compares the path's inode with the
// one recorded.)
func TestCarry(t *testing.T) {
	dir := t.TempDir()
	netns := filepath.Join(dir, "netns")
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(netns, &st); err != nil {
		t.Fatal(err)
	}
	a := ledger.Allocation{Netdev: "eth1", Queues: []uint32{2, 3}}
	att := func(netdev string, queues []uint32, path string, inode uint64) ledger.Attachment {
		return ledger.Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{Netns: path},
			Netdev: netdev, Queues: queues, NetnsInode: inode}}
	}
	for _, c := range []struct {
		name string
		att  ledger.Attachment
		want bool
	}{
		{"same netdev, queues and pod", att("eth1", []uint32{2, 3}, netns, st.Ino), true},
		{"another netdev", att("eth2", []uint32{2, 3}, netns, st.Ino), false},
		{"other queues", att("eth1", []uint32{2}, netns, st.Ino), false},
		{"the pod's netns gone", att("eth1", []uint32{2, 3}, filepath.Join(dir, "gone"), st.Ino), false},
		{"another netns at the path", att("eth1", []uint32{2, 3}, netns, st.Ino+1), false},
		{"no netns known", att("eth1", []uint32{2, 3}, netns, 0), false},
	} {
		if got := carry(c.att, a); got != c.want {
			t.Errorf("%s: carry %v, want %v", c.name, got, c.want)
		}
	}
}
