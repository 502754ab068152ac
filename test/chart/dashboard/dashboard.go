// Package dashboard is xdpq's Grafana dashboard, built with Grafana's
// Foundation SDK: per node and per queue, what pods receive and what the
// kernel loses and why, the netdevs' XDP state over time, the pools, the
// re-attaches, the CNI verbs and the config's reloads. Every query reads
// a family the daemon exports (pkg/daemon/metrics.go, pkg/agent/metrics.go);
// the package's test runs each against a real Prometheus scraping a real
// daemon.
//
// cmd/dashboard writes it to charts/xdpq/files/xdpq-dashboard.json (the
// chart's ConfigMap for Grafana's dashboard sidecar) and
// docs/dashboard/xdpq-dashboard.json; `make generate` runs it.
package dashboard

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's uid: stable, so links to it and the sidecar's
// updates keep finding it.
const UID = "xdpq-overview"

// The dashboard's variables, as its queries spell them.
const (
	// DatasourceVar is the Prometheus data source.
	DatasourceVar = "datasource"
	// NodeVar is the nodes shown: the daemons' series carry their node as
	// label node (the chart's ServiceMonitor relabels it so).
	NodeVar = "node"
	// RateInterval is Grafana's window for rate(): four scrape
	// intervals at least.
	RateInterval = "$__rate_interval"
)

// NodeQuery is the node variable's query: the nodes of the daemons that
// report a pool.
const NodeQuery = "label_values(xdpq_pool_capacity_devices, node)"

// sel is the label selector every query starts from: the chosen nodes,
// and more matchers.
func sel(more string) string {
	s := `node=~"$` + NodeVar + `"`
	if more != "" {
		s += ", " + more
	}
	return "{" + s + "}"
}

// verbLatency is a panel of a histogram family by verb (the daemon's
// CNI and DRA verbs): its p50 and p99.
func verbLatency(title, description, metric string) panel {
	return panel{title: title, description: description, unit: "s", targets: []target{
		{quantile("0.5", "verb", metric), "{{verb}} p50"},
		{quantile("0.99", "verb", metric), "{{verb}} p99"},
	}}
}

// verbResults is a panel of the same family's rate by verb and result.
func verbResults(title, description, metric string) panel {
	return panel{title: title, description: description, unit: "ops",
		targets: []target{{rate("verb, result", metric+"_count", ""), "{{verb}} {{result}}"}}}
}

// rate is the per-second rate of a counter family, summed by labels.
func rate(by, metric, matchers string) string {
	return fmt.Sprintf("sum by (%s) (rate(%s%s[%s]))", by, metric, sel(matchers), RateInterval)
}

// quantile is the q-quantile of a histogram family over the rate window,
// by labels.
func quantile(q, by, metric string) string {
	return fmt.Sprintf("histogram_quantile(%s, sum by (le, %s) (rate(%s_bucket%s[%s])))", q, by, metric, sel(""), RateInterval)
}

// Netdev states as the state panel's values: the agent reports a gauge
// per state, 1 for the netdev's current one, which the query folds into
// one number per netdev.
var states = []struct {
	name  string
	color string
}{
	{"None", "text"}, {"Direct", "green"}, {"Filter", "blue"}, {"Overridden", "orange"}, {"Missing", "red"},
}

// StateQuery is the netdev state panel's query: per node and netdev, the
// index of its state in None, Direct, Filter, Overridden, Missing.
func StateQuery() string {
	q := ""
	for i, s := range states[1:] {
		if q != "" {
			q += "\n+ "
		}
		q += fmt.Sprintf("%d * max by (node, netdev) (xdpq_agent_netdev_state%s)", i+1, sel(`state="`+s.name+`"`))
	}
	return q
}

// target is one query of a panel.
type target struct {
	expr, legend string
}

// panel is a panel of the dashboard.
type panel struct {
	title, description string
	kind               string // "timeseries" (default) or "state"
	unit               string
	targets            []target
	mappings           []dashboard.ValueMapping // state panels
}

// row is a row of panels.
type row struct {
	title  string
	panels []panel
}

// lossReasons are the kernel's counters of frames a socket lost
// (XDP_STATISTICS), by the reason a panel names them with. (The two
// invalid descriptor counters are a target each: rate() over a name
// matcher of both drops their names, and Prometheus refuses the two
// series it leaves with one label set.)
var lossReasons = []struct{ name, metric string }{
	{"rx dropped", "xdpq_socket_rx_dropped_frames_total"},
	{"rx ring full", "xdpq_socket_rx_ring_full_frames_total"},
	{"fill ring empty", "xdpq_socket_fill_ring_empty_total"},
	{"rx invalid descriptors", "xdpq_socket_rx_invalid_descriptors_total"},
	{"tx invalid descriptors", "xdpq_socket_tx_invalid_descriptors_total"},
}

// perPod is the per-second rate of a per-queue counter family, summed
// per pod: joined with xdpq_queue_info, which names the pod holding each
// queue (empty until the daemon knows it).
func perPod(metric, matchers string) string {
	return fmt.Sprintf("sum by (namespace, pod) (rate(%s%s[%s]) * on (node, netdev, queue) group_left (namespace, pod) "+
		"max by (node, netdev, queue, namespace, pod) (xdpq_queue_info%s))", metric, sel(matchers), RateInterval, sel(""))
}

// losses are a target per loss reason, summed by labels.
func losses(by, legend string) []target {
	var ts []target
	for _, r := range lossReasons {
		ts = append(ts, target{rate(by, r.metric, ""), legend + " " + r.name})
	}
	return ts
}

// podLosses are a target per loss reason, per pod.
func podLosses() []target {
	var ts []target
	for _, r := range lossReasons {
		ts = append(ts, target{perPod(r.metric, ""), "{{namespace}}/{{pod}} " + r.name})
	}
	return ts
}

func stateMappings() []dashboard.ValueMapping {
	opts := map[string]dashboard.ValueMappingResult{}
	for i, s := range states {
		text, color, index := s.name, s.color, int32(i)
		opts[fmt.Sprint(i)] = dashboard.ValueMappingResult{Text: &text, Color: &color, Index: &index}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}

func reloadMappings() []dashboard.ValueMapping {
	opts := map[string]dashboard.ValueMappingResult{}
	for i, s := range []struct{ text, color string }{{"refused: the last good config stays", "red"}, {"in force", "green"}} {
		text, color, index := s.text, s.color, int32(i)
		opts[fmt.Sprint(i)] = dashboard.ValueMappingResult{Text: &text, Color: &color, Index: &index}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}

// rows are the dashboard's content.
func rows() []row {
	queue := "{{node}} {{netdev}} q{{queue}}"
	return []row{
		{"Receive", []panel{
			{title: "Frames redirected to pods per node",
				description: "Frames xdpq's program (filter or direct) redirected to pods' sockets, per second (xdpq_agent_program_packets_total, result redirected): " +
					"what the pods receive plus what the kernel then lost for them (Losses, below). " +
					"A netdev whose hook a foreign program holds (Overridden) counts nothing here.",
				unit: "pps", targets: []target{{rate("node", "xdpq_agent_program_packets_total", `result="redirected"`), "{{node}}"}}},
			{title: "Frames redirected to pods per queue",
				description: "Per netdev queue: the frames redirected to the socket of the pod holding the queue, per second; what the pod receives is this less the queue's losses below. " +
					"`kubectl xdpq pods -A --node <node>` names the pod of a queue.",
				unit: "pps", targets: []target{{rate("node, netdev, queue", "xdpq_agent_program_packets_total", `result="redirected"`), queue}}},
			{title: "Frames not redirected per queue",
				description: "passed: frames no pod's flow matched, given to the kernel's stack. redirect_failed: a flow matched but its queue had no socket (the pod is not reading yet, or has gone).",
				unit:        "pps", targets: []target{{rate("node, netdev, queue, result", "xdpq_agent_program_packets_total", `result!="redirected"`), queue + " {{result}}"}}},
		}},
		{"Per pod", []panel{
			{title: "Frames redirected per pod",
				description: "Per pod (namespace/pod), the frames redirected to the sockets of the queues it holds, per second: " +
					"the per-queue counter joined with xdpq_queue_info, which names the pod of each allocated queue once the daemon knows it " +
					"(its CNI attachment, its claim, or its first connection); until then the pod is empty.",
				unit: "pps", targets: []target{{perPod("xdpq_agent_program_packets_total", `result="redirected"`), "{{namespace}}/{{pod}}"}}},
			{title: "Losses per pod by reason",
				description: "Per pod, the frames the kernel lost for its sockets per second, by reason (as in Losses, below).",
				unit:        "pps", targets: podLosses()},
		}},
		{"Losses (the kernel's socket statistics)", []panel{
			{title: "Losses per node by reason",
				description: "Frames the kernel lost for pods' sockets, per second, by the reason it counts: " +
					"rx dropped (no frame on the fill ring, or a frame larger than a UMEM frame), rx ring full (the pod reads too slowly), " +
					"fill ring empty (the pod gives frames back too slowly), invalid descriptors (the application's ring handling is wrong). " +
					"The alerts XdpqQueue* fire on these (docs/alerts).",
				unit: "pps", targets: losses("node", "{{node}}")},
			{title: "Losses per queue by reason",
				description: "As per node, per netdev queue, that is per pod: `kubectl xdpq pods -A --node <node>` names the pod of a queue. " +
					"A queue's series exist while a pod holds its sockets and start from zero with each new lease.",
				unit: "pps", targets: losses("node, netdev, queue", queue)},
		}},
		{"Netdevs", []panel{
			{title: "Netdev state", kind: "state",
				description: "The XDP hook of each pooled netdev: None (no socket bound: no program), Direct (xdpq's program redirects by queue), " +
					"Filter (xdpq's program redirects the pods' flows), Overridden (a foreign program holds the hook; xdpq steps aside), " +
					"Missing (the netdev is not there).",
				targets: []target{{StateQuery(), "{{node}} {{netdev}}"}}, mappings: stateMappings()},
			{title: "Sockets and steered flows per netdev",
				description: "Queues with a pod's socket in the netdev's XSKMAP, and the flows xdpq steers there (ntuple rules or filter map entries).",
				targets: []target{
					{"sum by (node, netdev) (xdpq_agent_netdev_sockets" + sel("") + ")", "{{node}} {{netdev}} sockets"},
					{"sum by (node, netdev, steering) (xdpq_agent_steered_flows" + sel("") + ")", "{{node}} {{netdev}} {{steering}} flows"},
				}},
			{title: "Re-attach latency",
				description: "After a foreign XDP program leaves a netdev, how long xdpq takes to attach its own again: from the link notification's reconcile to the program attached.",
				unit:        "s", targets: []target{
					{quantile("0.5", "node, netdev", "xdpq_agent_reattach_duration_seconds"), "{{node}} {{netdev}} p50"},
					{quantile("0.99", "node, netdev", "xdpq_agent_reattach_duration_seconds"), "{{node}} {{netdev}} p99"},
				}},
		}},
		{"Pools", []panel{
			{title: "Pool capacity vs allocated",
				description: "Devices (queues, or netdevs in a netdev-mode pool) each pool has on the chosen nodes, and those allocations hold.",
				targets: []target{
					{"sum by (pool) (xdpq_pool_capacity_devices" + sel("") + ")", "{{pool}} capacity"},
					{"sum by (pool) (xdpq_pool_allocated_devices" + sel("") + ")", "{{pool}} allocated"},
				}},
			{title: "Allocations and leases",
				description: "Allocations of each pool, and those whose sockets a pod holds now (an active lease). An allocation without a lease is a pod that has not connected, or has stopped.",
				targets: []target{
					{"sum by (pool) (xdpq_pool_allocations" + sel("") + ")", "{{pool}} allocations"},
					{"sum by (pool) (xdpq_pool_leases" + sel("") + ")", "{{pool}} leases"},
				}},
		}},
		{"Daemon", []panel{
			verbLatency("CNI latency", "How long the daemon took to answer the CNI plugin's verbs (ADD, DEL, CHECK, GC), by verb.",
				"xdpq_cni_operation_duration_seconds"),
			verbResults("CNI operations by result", "CNI verbs the daemon answered per second, by verb and result: success, or the error's code.",
				"xdpq_cni_operation_duration_seconds"),
			verbLatency("DRA Prepare latency", "How long the DRA driver took to prepare and unprepare a claim for kubelet, by verb: a pod's containers start after its claims' Prepare.",
				"xdpq_dra_operation_duration_seconds"),
			verbResults("DRA operations by result", "Claims the DRA driver prepared and unprepared per second, by verb and result: success, or the error's code.",
				"xdpq_dra_operation_duration_seconds"),
			{title: "Config in force", kind: "state",
				description: "Whether the config file on disk is the config in force on each node: refused means its last reload failed and the last good config stays (alert XdpqConfigRefused).",
				targets:     []target{{"min by (node) (xdpq_config_last_reload_successful" + sel("") + ")", "{{node}}"}}, mappings: reloadMappings()},
			{title: "Config reloads",
				description: "Reloads of the config file after the first load, per second, by result.",
				unit:        "ops", targets: []target{{rate("node, result", "xdpq_config_reloads_total", ""), "{{node}} {{result}}"}}},
			{title: "Broker refusals",
				description: "Connections to allocations' sockets the broker refused per second, by the protocol's code (forbidden: a peer that is not the allocation's owner; limit: rings or UMEM beyond the pool's limits).",
				unit:        "ops", targets: []target{{rate("node, code", "xdpq_broker_refusals_total", ""), "{{node}} {{code}}"}}},
		}},
	}
}

// Build returns the dashboard as Grafana's JSON model, indented, ending
// in a newline.
func Build() ([]byte, error) {
	ds := common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${" + DatasourceVar + "}")}
	// The classic JSON model, which the SDK marks deprecated for its v2
	// schema: v2 loads only in Grafana 12 with its Kubernetes-style
	// dashboard API switched on, while Grafana's dashboard sidecar and
	// file provisioning of every Grafana in use load this one.
	//lint:ignore SA1019 see above
	b := dashboard.NewDashboardBuilder("xdpq").
		Uid(UID).
		Description("Generated by test/chart/cmd/dashboard (make generate); do not edit. "+
			"What pods receive on their AF_XDP queues, what the kernel loses and why, and the state of the netdevs, pools and daemons.").
		Tags([]string{"xdpq", "af_xdp", "kubernetes"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder(DatasourceVar).Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder(NodeVar).Label("Node").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr(NodeQuery)}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*"))
	id := uint32(0)
	for _, r := range rows() {
		id++
		b.WithRow(dashboard.NewRowBuilder(r.title).Id(id))
		for _, p := range r.panels {
			id++
			var queries []cog.Builder[variants.Dataquery]
			for i, t := range p.targets {
				queries = append(queries, prometheus.NewDataqueryBuilder().
					Datasource(ds).
					Expr(t.expr).
					LegendFormat(t.legend).
					Range().
					RefId(string(rune('A'+i))))
			}
			legend := common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).
				Placement(common.LegendPlacementBottom).ShowLegend(true)
			switch p.kind {
			case "state":
				b.WithPanel(statetimeline.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).
					Datasource(ds).Targets(queries).Mappings(p.mappings).
					ShowValue(common.VisibilityModeNever).MergeValues(true).
					ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds)).
					Legend(legend.ShowLegend(false)).
					Span(12).Height(8))
			default:
				tp := timeseries.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).
					Datasource(ds).Targets(queries).Min(0).FillOpacity(10).Legend(legend).
					Span(12).Height(8)
				if p.unit != "" {
					tp.Unit(p.unit)
				}
				b.WithPanel(tp)
			}
		}
	}
	d, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("build the dashboard: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the dashboard: %w", err)
	}
	return append(out, '\n'), nil
}
