package config

import (
	"fmt"
	"io"
	"strings"
)

// Usage writes the help text to w: every setting with its flag, environment
// variable, config file key, default and meaning, then the OpenTelemetry
// variables the service honours. program is the command's name.
func Usage(w io.Writer, program string) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s [flags]\n\n", program)
	b.WriteString(wrap("ratelimiter serves rate limits over HTTP: named limiters shared by callers, and a limit "+
		"per requester IP address. Each setting is taken from its flag, else its environment variable (empty "+
		"counts as unset), else the config file when it has a key there, else its default.", "", 80))
	for _, g := range groups {
		fmt.Fprintf(&b, "\n%s:\n", g)
		for _, s := range settings {
			if s.group != g {
				continue
			}
			fmt.Fprintf(&b, "  --%s %s\n", s.name, s.arg)
			source := "env " + s.env
			if s.file != "" {
				source += ", file " + s.file
			}
			if s.def != "" {
				source += fmt.Sprintf(", default %q", s.def)
			} else {
				source += ", default empty"
			}
			b.WriteString(wrap(source, "      ", 80))
			b.WriteString(wrap(s.usage, "      ", 80))
		}
	}
	b.WriteString("\nOther flags:\n")
	b.WriteString("  --version\n" + wrap("Print the version and exit.", "      ", 80))
	b.WriteString("  --help\n" + wrap("Print this help and exit.", "      ", 80))
	fmt.Fprintf(&b, "\nSubcommands:\n  %s probe [--timeout 5s] URL\n", program)
	b.WriteString(wrap("Send GET URL and exit 0 on a 2xx answer, 1 otherwise: a health check for images "+
		"without a shell, e.g. probe http://127.0.0.1:8080/readyz.", "      ", 80))
	b.WriteString(`
Tracing (standard OpenTelemetry environment variables):
  OTEL_TRACES_EXPORTER         none (default), otlp or console
  OTEL_EXPORTER_OTLP_ENDPOINT  where otlp sends spans (default http://localhost:4318)
  OTEL_EXPORTER_OTLP_PROTOCOL  http/protobuf (default) or grpc
  OTEL_TRACES_SAMPLER          default parentbased_always_on; for example
                               parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=0.01
  OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES  resource attributes
Metrics are served in the Prometheus format at GET /metrics.

Config file (YAML; unknown keys are errors):
  limiters:
    - name: payments-api
      limit: 5
      period: 1m
      algorithm: sliding_log   # gcra (default) or sliding_log
      burst: 0                 # gcra only; 0 means limit
    - name: search-per-user
      limit: 100
      period: 1m
      group: search            # decided together with its group's others
      keyed: true              # one bucket per key
      max_keys: 50000          # keyed only, 1 to 10000000; default 10000
  tenants:                     # the per-IP policy; see the tenant settings
    limit: 100
    period: 1m
    algorithm: gcra
    burst: 0
    ipv6_prefix: 64
    max_tenants: 1000000
    max_bytes: 268435456
`)
	io.WriteString(w, b.String())
}

// wrap fills text into lines of at most width characters, each starting with
// indent, and ends it with a newline.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(text) {
		if line != indent && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
	return b.String()
}
