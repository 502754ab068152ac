package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// printTable writes a command's answer for a person: tables with a header
// line, "-" for nothing, like kubectl's. now is for the allocations' ages.
func printTable(w io.Writer, out any, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	switch v := out.(type) {
	case *api.Allocation:
		fmt.Fprintln(tw, "ID\tPOOL\tNETDEV\tQUEUES\tUID\tSOCKET")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.ID, v.Pool, v.Netdev, queueList(v.Queues), uid(v.UID), v.Socket)
	case api.FreeAnswer:
		fmt.Fprintf(tw, "freed %s\n", v.Freed)
	case statusView:
		printStatus(tw, v, now)
	case *api.AllocationList:
		printAllocations(tw, v, now)
	case versionView:
		fmt.Fprintf(tw, "xdpqctl:\t%s\n", v.Client)
		if v.Daemon != nil {
			release := v.Daemon.Release
			if release == "" {
				release = "before releases"
			}
			fmt.Fprintf(tw, "daemon:\t%s (API %d)\n", release, v.Daemon.API)
		}
	default:
		return fmt.Errorf("no table for %T", out)
	}
	return tw.Flush()
}

// statusView is what the status command shows as a table: the status,
// and the allocations it counts.
type statusView struct {
	*api.Status
	list *api.AllocationList
}

// section writes a table of n rows, or none when n is 0. (tabwriter
// aligns the columns of a block of lines that have tabs; a line without
// one ends the block, so each table aligns on its own.)
func section(tw *tabwriter.Writer, n int, none, header string, row func(i int)) {
	if n == 0 {
		fmt.Fprintln(tw, none)
		return
	}
	fmt.Fprintln(tw, header)
	for i := range n {
		row(i)
	}
}

func printStatus(tw *tabwriter.Writer, v statusView, now time.Time) {
	s := v.Status
	section(tw, len(s.Pools), "no pools", "POOL\tRESOURCE\tQUEUES\tFREE\tALLOCATIONS\tREASON", func(i int) {
		p := s.Pools[i]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", p.Name, p.Resource, p.Queues, p.Free, p.Allocations, dash(p.Reason))
	})
	fmt.Fprintln(tw)
	printAllocations(tw, v.list, now)
	fmt.Fprintln(tw)
	section(tw, len(s.Netdevs), "no netdevs", "NETDEV\tSTATE\tMODE\tSTEERING\tFLOWS\tSOCKETS\tLINK\tREASON", func(i int) {
		n := s.Netdevs[i]
		link := "down"
		if n.LinkUp {
			link = "up"
		}
		reason := n.Reason
		if n.PolicyError != "" {
			reason = strings.TrimPrefix(reason+"; "+n.PolicyError, "; ")
		}
		flows := strconv.Itoa(n.Flows)
		if n.UnknownFlows > 0 {
			flows += fmt.Sprintf(" (+%d unknown)", n.UnknownFlows)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Netdev, dash(n.State), dash(n.Mode), dash(n.Steering), flows,
			dash(queueList(n.Sockets)), link, dash(reason))
	})
	if s.ConfigError != "" {
		fmt.Fprintf(tw, "\nconfig: %s\n", s.ConfigError)
	}
	for _, e := range s.StateErrors {
		fmt.Fprintf(tw, "\nrecord: %s\n", e)
	}
}

// printAllocations writes the allocations, each with who holds it, and
// their CNI attachments.
func printAllocations(tw *tabwriter.Writer, l *api.AllocationList, now time.Time) {
	section(tw, len(l.Allocations), "no allocations", "ALLOCATION\tPOOL\tNETDEV\tQUEUES\tUID\tPOD\tLEASE\tHOLDER\tAGE", func(i int) {
		a := l.Allocations[i]
		pod := a.Pod
		if pod == "" {
			pod = a.PodUID
		}
		holder := "-"
		if h := a.Holder; h != nil {
			holder = fmt.Sprintf("pid %d uid %d", h.PID, h.UID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Pool, a.Netdev, queueList(a.Queues), uid(a.UID), dash(pod),
			dash(queueList(a.Lease)), holder, age(now, a.Created))
	})
	fmt.Fprintln(tw)
	section(tw, len(l.Attachments), "no CNI attachments", "CONTAINER\tINTERFACE\tNETNS\tALLOCATION\tPOD\tSTATE\tFLOWS", func(i int) {
		a := l.Attachments[i]
		pod := ""
		if a.PodName != "" {
			pod = a.PodNamespace + "/" + a.PodName
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shortID(a.ContainerID), a.IfName, dash(a.Netns), a.AllocationID, dash(pod), a.State, dash(flowList(a.Flows)))
	})
}

// queueList is queues as ranges: "0-3,6".
func queueList(qs []uint32) string {
	var b strings.Builder
	for i := 0; i < len(qs); {
		j := i
		for j+1 < len(qs) && qs[j+1] == qs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(qs[i]), 10))
		if j > i {
			b.WriteString("-" + strconv.FormatUint(uint64(qs[j]), 10))
		}
		i = j + 1
	}
	return b.String()
}

// flowList is flows as "udp 10.0.0.2/32:2152 from 10.1.0.0/16 vlan 5".
func flowList(fs []api.CNIFlow) string {
	var out []string
	for _, f := range fs {
		s := f.Protocol + " " + f.Dst.String()
		if f.DstPort != 0 {
			s += ":" + strconv.Itoa(int(f.DstPort))
		}
		if f.Src.IsValid() || f.SrcPort != 0 {
			s += " from "
			if f.Src.IsValid() {
				s += f.Src.String()
			} else {
				s += "any"
			}
			if f.SrcPort != 0 {
				s += ":" + strconv.Itoa(int(f.SrcPort))
			}
		}
		if f.VLAN != 0 {
			s += " vlan " + strconv.Itoa(int(f.VLAN))
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

func uid(u *uint32) string {
	if u == nil {
		return "-"
	}
	return strconv.FormatUint(uint64(*u), 10)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortID is a container id as runtimes print it: its first 12
// characters.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// age is how long ago t was, as kubectl prints it: 45s, 3m, 5h, 2d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}
