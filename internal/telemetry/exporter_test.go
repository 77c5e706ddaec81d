package telemetry

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestSpanExporter(t *testing.T) {
	tests := []struct {
		exporter, protocol string
		want               string // the exporter's type, "<nil>" for none
		wantErr            string
	}{
		{exporter: "", want: "<nil>"},
		{exporter: "none", want: "<nil>"},
		{exporter: "console", want: "*stdouttrace.Exporter"},
		{exporter: "otlp", want: "*otlptrace.Exporter"},
		{exporter: "otlp", protocol: "http/protobuf", want: "*otlptrace.Exporter"},
		{exporter: "otlp", protocol: "grpc", want: "*otlptrace.Exporter"},
		{exporter: "otlp", protocol: "http/json", wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{exporter: "zipkin", wantErr: "OTEL_TRACES_EXPORTER"},
	}
	for _, tt := range tests {
		t.Run(tt.exporter+"/"+tt.protocol, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", tt.exporter)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tt.protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
			exp, err := spanExporter(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if exp != nil {
				t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
			}
			if got := fmt.Sprintf("%T", exp); got != tt.want && !(exp == nil && tt.want == "<nil>") {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}
