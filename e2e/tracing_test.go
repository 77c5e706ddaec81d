package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimiter/ratelimiter/client"
)

// span is what the console exporter writes of a span, one JSON object each.
type span struct {
	Name        string
	SpanKind    int
	SpanContext spanContext
	Parent      spanContext
}

type spanContext struct {
	TraceID string
	SpanID  string
	Remote  bool
}

// spanKindServer is trace.SpanKindServer in the exporter's output.
const spanKindServer = 2

// TestTracing sends requests with a W3C traceparent and finds their server
// spans, named by operationId, in the spans the service writes to stdout.
func TestTracing(t *testing.T) {
	t.Parallel()
	svc := startService(t, map[string]string{
		"OTEL_TRACES_EXPORTER": "console",
		// Export every 100ms rather than every 5s.
		"OTEL_BSP_SCHEDULE_DELAY": "100",
	})
	api := svc.api
	ctx := t.Context()
	const name = "traced"
	put(t, api, name, client.LimiterSpec{Limit: 5, Period: "1m"})

	type call struct {
		operation string
		sampled   bool
		do        func(client.RequestEditorFn) (answer, error)
		wantSpan  bool // the server span must be exported
		wantChild bool // with a child span for the decision
	}
	one := int64(1)
	calls := []call{
		// First the requests that must leave no span: once the spans of the
		// later ones are out, theirs would be too.
		{"getAvailable", false, func(e client.RequestEditorFn) (answer, error) {
			return api.GetAvailableWithResponse(ctx, name, nil, e)
		}, false, false},
		{"getReadiness", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetReadinessWithResponse(ctx, e)
		}, false, false},
		{"putLimiter", true, func(e client.RequestEditorFn) (answer, error) {
			return api.PutLimiterWithResponse(ctx, name, client.LimiterSpec{Limit: 6, Period: "1m"}, e)
		}, true, false},
		{"getLimiter", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetLimiterWithResponse(ctx, name, e)
		}, true, false},
		{"acquire", true, func(e client.RequestEditorFn) (answer, error) {
			return api.AcquireWithResponse(ctx, name, client.AcquireRequest{Permits: &one}, e)
		}, true, true},
		{"getAvailable", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetAvailableWithResponse(ctx, name, nil, e)
		}, true, false},
		{"listLimiters", true, func(e client.RequestEditorFn) (answer, error) {
			return api.ListLimitersWithResponse(ctx, nil, e)
		}, true, false},
		{"acquireTenant", true, func(e client.RequestEditorFn) (answer, error) {
			return api.AcquireTenantWithResponse(ctx, "203.0.113.9", client.AcquireRequest{Permits: &one}, e)
		}, true, true},
		{"getTenantAvailable", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetTenantAvailableWithResponse(ctx, "2001:db8::9", e)
		}, true, false},
		{"listLowestTenants", true, func(e client.RequestEditorFn) (answer, error) {
			return api.ListLowestTenantsWithResponse(ctx, nil, e)
		}, true, false},
		{"getTenantPolicy", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetTenantPolicyWithResponse(ctx, e)
		}, true, false},
		{"getOpenAPI", true, func(e client.RequestEditorFn) (answer, error) {
			return api.GetOpenAPIWithResponse(ctx, e)
		}, true, false},
		{"deleteLimiter", true, func(e client.RequestEditorFn) (answer, error) {
			return api.DeleteLimiterWithResponse(ctx, name, e)
		}, true, false},
	}
	type sent struct {
		call
		traceID, parentID string
	}
	var all []sent
	for _, c := range calls {
		traceID, parentID := randomHex(t, 16), randomHex(t, 8)
		flags := "00"
		if c.sampled {
			flags = "01"
		}
		traceparent := "00-" + traceID + "-" + parentID + "-" + flags
		res, err := c.do(func(_ context.Context, req *http.Request) error {
			req.Header.Set("traceparent", traceparent)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", c.operation, err)
		}
		if s := res.StatusCode(); s >= 300 {
			t.Fatalf("%s: got %d %s, want success", c.operation, s, res.GetBody())
		}
		all = append(all, sent{c, traceID, parentID})
	}

	// Wait until every span that must be exported is.
	var spans []span
	deadline := time.Now().Add(20 * time.Second)
	for {
		stdout, _, err := svc.logs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		spans = decodeSpans(t, stdout)
		missing := 0
		for _, s := range all {
			if s.wantSpan && findSpan(spans, s.traceID, s.operation) == nil {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d server spans still missing after 20s among the %d spans on stdout", missing, len(spans))
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, s := range all {
		label := s.operation
		switch {
		case !s.sampled:
			label += " not sampled"
		case !s.wantSpan:
			label += " untraced probe"
		}
		t.Run(label, func(t *testing.T) {
			server := findSpan(spans, s.traceID, s.operation)
			if !s.wantSpan {
				for _, sp := range spans {
					if sp.SpanContext.TraceID == s.traceID {
						t.Errorf("got span %q in trace %s, want none", sp.Name, s.traceID)
					}
				}
				return
			}
			if server.Parent.TraceID != s.traceID || server.Parent.SpanID != s.parentID || !server.Parent.Remote {
				t.Errorf("parent: got %+v, want the remote span %s of trace %s", server.Parent, s.parentID, s.traceID)
			}
			if server.SpanContext.SpanID == s.parentID || len(server.SpanContext.SpanID) != 16 {
				t.Errorf("span ID: got %q, want a new one, not the parent's %s", server.SpanContext.SpanID, s.parentID)
			}
			if server.SpanKind != spanKindServer {
				t.Errorf("span kind: got %d, want %d (server)", server.SpanKind, spanKindServer)
			}
			if s.wantChild {
				var children []string
				for _, sp := range spans {
					if sp.SpanContext.TraceID == s.traceID && sp.Parent.SpanID == server.SpanContext.SpanID {
						children = append(children, sp.Name)
					}
				}
				if len(children) == 0 {
					t.Errorf("got no child span of %s, want one for the decision", s.operation)
				}
			}
		})
	}
}

// randomHex is n random bytes in lowercase hex, as trace and span IDs are
// written.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// decodeSpans reads the spans the console exporter wrote; stdout holds
// nothing else.
func decodeSpans(t *testing.T, stdout []byte) []span {
	t.Helper()
	var spans []span
	dec := json.NewDecoder(bytes.NewReader(stdout))
	for {
		var s span
		err := dec.Decode(&s)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return spans // the end, or a span being written
		}
		if err != nil {
			t.Fatalf("stdout: want only spans in JSON: %v", err)
		}
		spans = append(spans, s)
	}
}

// findSpan returns the span named name in the trace, or nil.
func findSpan(spans []span, traceID, name string) *span {
	for i := range spans {
		if spans[i].SpanContext.TraceID == traceID && spans[i].Name == name {
			return &spans[i]
		}
	}
	return nil
}
