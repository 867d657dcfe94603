package config

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// WriteYAML writes Marshal's rendering to w, in time and memory linear in
// the config: everything but the tenants is encoded at once, each tenant
// on its own (one encoding of a million-entry mapping keeps every event of
// it in memory).
func (c *Config) WriteYAML(w io.Writer) error {
	return c.WriteYAMLContext(context.Background(), w)
}

// WriteYAMLContext is WriteYAML that stops when ctx is done.
func (c *Config) WriteYAMLContext(ctx context.Context, w io.Writer) error {
	base := *c
	base.Tenants = nil
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&base); err != nil {
		return fmt.Errorf("config: encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("config: encode YAML: %w", err)
	}
	head, tail := buf.Bytes(), []byte(nil)
	// Tenants come right before default_tier, which is always written.
	if i := bytes.Index(head, []byte("\ndefault_tier:")); i >= 0 {
		head, tail = head[:i+1], head[i+1:]
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	if len(c.Tenants) > 0 {
		if _, err := io.WriteString(w, "tenants:\n"); err != nil {
			return err
		}
		var one bytes.Buffer
		for i, name := range sortedKeys(c.Tenants) {
			if i%ctxCheckEvery == 0 {
				if err := canceled(ctx); err != nil {
					return err
				}
			}
			one.Reset()
			if err := renderTenant(&one, name, c.Tenants[name]); err != nil {
				return err
			}
			if _, err := w.Write(one.Bytes()); err != nil {
				return err
			}
		}
	}
	_, err := w.Write(tail)
	return err
}

// renderTenant writes one entry of the tenants mapping as the encoder
// writes it inside the whole config (indented by 2).
func renderTenant(out *bytes.Buffer, name string, t Tenant) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(map[string]Tenant{name: t}); err != nil {
		return fmt.Errorf("config: encode tenant %s: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("config: encode tenant %s: %w", name, err)
	}
	for line := range bytes.Lines(buf.Bytes()) {
		out.WriteString("  ")
		out.Write(line)
	}
	return nil
}
