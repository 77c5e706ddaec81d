package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// spanExporter returns the exporter OTEL_TRACES_EXPORTER names: nil for
// "none" or unset (this service traces only when asked to), an OTLP
// exporter for "otlp" over the protocol OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
// or OTEL_EXPORTER_OTLP_PROTOCOL names (http/protobuf by default, or grpc),
// and a JSON writer to standard output for "console". The OTLP exporters
// read their other OTEL_EXPORTER_OTLP_* variables themselves.
//
// Only traces are exported this way, so only the trace exporters are
// linked in: the general-purpose autoexport package would also bring the
// metric and log exporters, several megabytes of the image.
func spanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	name := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	switch name {
	case "", "none":
		return nil, nil
	case "console":
		return stdouttrace.New()
	case "otlp":
		protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch protocol {
		case "", "http/protobuf":
			return otlptracehttp.New(ctx)
		case "grpc":
			return otlptracegrpc.New(ctx)
		}
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL=%q: want http/protobuf or grpc", protocol)
	}
	return nil, fmt.Errorf("telemetry: traces exporter OTEL_TRACES_EXPORTER=%q: want none, otlp or console", name)
}
