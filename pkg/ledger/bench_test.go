package ledger

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// BenchmarkAttachDetach is the ledger's share of a CNI ADD and DEL of a
// pod on an allocation of a pool with other live pods: the record is
// written four times (the attachment begun, made, its end begun, ended).
// Its directory is $XDPQ_BENCH_DIR (a tmpfs, as /run is on a node) or a
// test directory.
func BenchmarkAttachDetach(b *testing.B) {
	l, err := Open(Options{Dir: testnet.BenchDir(b, "ledger-")})
	if err != nil {
		b.Fatal(err)
	}
	var netdevs []string
	for i := range 8 {
		netdevs = append(netdevs, fmt.Sprintf("n%d", i))
	}
	l.SetPools([]Pool{queuePool("big", netdevs, 0, 1, 2, 3, 4, 5, 6, 7)})
	var ids []string
	for i := range 64 {
		a, err := l.Reserve(Reservation{Pool: "big", Devices: []string{fmt.Sprintf("n%d-q%d", i/8, i%8)}, Owner: Owner{PodUID: fmt.Sprint(i)}})
		if err == nil {
			err = l.Commit(a.ID, nil)
		}
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, a.ID)
	}
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.100.0.1/32"), DstPort: 2152}
	i := 0
	for b.Loop() {
		att := Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: fmt.Sprintf("%064x", i), IfName: "net1",
			PodNamespace: "bench", PodName: "pod", PodUID: "00000000-0000-0000-0000-000000000001", Netns: "/var/run/netns/cni-0000",
			Flows: []api.CNIFlow{flow}}, Mode: api.ModeQueue}}
		got, _, err := l.BeginAttach(ids[i%len(ids)], att)
		if err == nil {
			err = l.EndAttach(got, true)
		}
		if err == nil {
			_, _, err = l.BeginDetach(att.Key())
		}
		if err == nil {
			err = l.EndDetach(att.Key())
		}
		if err != nil {
			b.Fatal(err)
		}
		i++
	}
}
