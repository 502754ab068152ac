// Command kubesd runs Prometheus's own Kubernetes service discovery (the
// package github.com/prometheus/prometheus/discovery/kubernetes, the code
// a Prometheus server runs for a kubernetes_sd_configs entry) and writes
// the targets it finds, with their __meta_kubernetes_* labels, to a file
// a Prometheus server reads with file_sd_configs.
//
// The e2e scrapes the daemons with it and Debian's Prometheus server,
// which is built without Kubernetes discovery: the relabelling, the
// scrape and the queries are the server's, the discovery is
// Prometheus's, and a cold machine compiles a few packages (the rest,
// client-go, the e2e module compiles too) rather than a whole Prometheus
// server.
//
//	kubesd -config sd.yaml -output targets.json
//
// sd.yaml holds one kubernetes_sd_configs entry, as a scrape config
// would. kubesd runs until it is signalled (SIGTERM, SIGINT).
//
// Prometheus's adapter for such programs
// (documentation/examples/custom-sd/adapter) is not used: it writes a
// target's label values as targets (it expects a target to have only an
// address, where Kubernetes discovery gives each its own meta labels),
// and it passes updates on through a discovery manager that holds them
// for 5 seconds, before the server's own file discovery and scrape
// manager hold them for 5 more each.
//
// It is a module of its own, so that Prometheus' dependencies do not
// change what the e2e module builds the Kubernetes binaries with; its
// modules that the e2e module has too are at the e2e module's versions
// or newer (Prometheus needs some newer), so that most packages compile
// once for both.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/discovery/kubernetes"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	"go.yaml.in/yaml/v2"
)

func main() {
	config := flag.String("config", "", "a file with one kubernetes_sd_configs entry (YAML)")
	output := flag.String("output", "", "the file_sd file to write the targets to")
	flag.Parse()
	if *config == "" || *output == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kubesd -config sd.yaml -output targets.json")
		os.Exit(2)
	}
	if err := run(*config, *output); err != nil {
		fmt.Fprintln(os.Stderr, "kubesd:", err)
		os.Exit(1)
	}
}

func run(configFile, output string) error {
	b, err := os.ReadFile(configFile)
	if err != nil {
		return err
	}
	var cfg kubernetes.SDConfig
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", configFile, err)
	}
	// Relative files of the config (a CA, a token) are the config file's
	// directory's, as in a Prometheus server's configuration.
	dir, err := filepath.Abs(filepath.Dir(configFile))
	if err != nil {
		return err
	}
	cfg.SetDirectory(dir)

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	reg := prometheus.NewRegistry()
	mechanisms, err := discovery.RegisterSDMetrics(reg, discovery.NewRefreshMetrics(reg))
	if err != nil {
		return fmt.Errorf("discovery metrics: %w", err)
	}
	d, err := cfg.NewDiscoverer(discovery.DiscovererOptions{Logger: logger, Metrics: mechanisms[cfg.Name()], SetName: "kubesd"})
	if err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	updates := make(chan []*targetgroup.Group)
	go d.Run(ctx, updates)
	logger.Info("discovering", "role", cfg.Role, "output", output)
	// A discoverer sends the groups that changed, each whole; a group
	// with no target is one that went.
	groups := map[string]*targetgroup.Group{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case tgs := <-updates:
			for _, g := range tgs {
				if g != nil {
					groups[g.Source] = g
				}
			}
			if err := write(output, groups); err != nil {
				return err
			}
		}
	}
}

// fileGroup is a target group of a file_sd file.
type fileGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// write writes groups to the file_sd file output, replacing it whole
// (the server may read it at any moment): one group per target, with
// its group's labels and its own.
func write(output string, groups map[string]*targetgroup.Group) error {
	out := []fileGroup{}
	for _, src := range slices.Sorted(maps.Keys(groups)) {
		g := groups[src]
		for _, target := range g.Targets {
			labels := map[string]string{}
			for k, v := range g.Labels {
				labels[string(k)] = string(v)
			}
			for k, v := range target {
				labels[string(k)] = string(v)
			}
			addr := labels[model.AddressLabel]
			delete(labels, model.AddressLabel)
			out = append(out, fileGroup{Targets: []string{addr}, Labels: labels})
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(output), ".kubesd-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), output)
	}
	return err
}
