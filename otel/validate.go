package otel

import "log/slog"

// Validate reports every problem New would find in cfg and the OTEL_*
// environment (endpoint, protocol, headers, sampler, Prometheus address)
// without opening anything, so a command can refuse a bad setting before
// it loads probes or starts a job.
func Validate(cfg Config) error {
	cfg.Logger = slog.New(slog.DiscardHandler)
	_, err := resolve(cfg)
	return err
}
