package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/peers"
)

// startPeers joins the job's peer exchange (--peers; none when unset)
// and sends the engine's records to it.
func (p *pipeline) startPeers(ctx context.Context, job string, logger *slog.Logger) error {
	cfg := p.cfg.Config
	if cfg.Peers == "" {
		return nil
	}
	secret, err := peers.LoadSecret(cfg.PeersSecret)
	if err != nil {
		return err
	}
	x, err := peers.Start(ctx, peers.Config{Addr: cfg.Peers, Job: job, ID: sidecarID(cfg.Rank), Secret: secret, Log: logger})
	if err != nil {
		return err
	}
	p.peers = x
	p.eng.SetPeerOut(x.Send)
	p.hangs.send = x.Send
	return nil
}

// peerBatch hands another sidecar's records, or its leaving, to the engine.
func (p *pipeline) peerBatch(b peers.Batch) {
	p.hangs.peer(b)
	if b.Left {
		p.in.PeerLeft(b.From)
		return
	}
	p.in.Peer(b.From, b.Recs)
}

// sidecarID names this sidecar to the job's others: the host (a pod's
// name), the rank where known, and the pid, which tells two sidecars of
// one host apart.
func sidecarID(rank int) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if rank >= 0 {
		return fmt.Sprintf("%s/rank%d/%d", host, rank, os.Getpid())
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// peersLine is the live view's line about the peer exchange.
func peersLine(addr string, st peers.Stats) string {
	others := func(n int) string {
		if n == 1 {
			return "1 other sidecar"
		}
		return fmt.Sprintf("%d other sidecars", n)
	}
	var s string
	switch st.Role {
	case "hub":
		s = "serving " + addr + ", " + others(st.Peers)
	case "member":
		s = fmt.Sprintf("joined %s, %s, clock offset %s", addr, others(st.Peers), time.Duration(st.OffsetNS).Round(time.Microsecond))
	default:
		s = "connecting to " + addr
	}
	if st.Dropped > 0 {
		s += fmt.Sprintf(", %d records dropped", st.Dropped)
	}
	if st.Rejected > 0 {
		s += fmt.Sprintf(", %d records rejected", st.Rejected)
	}
	return s
}
