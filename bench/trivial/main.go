// Command trivial is the ceiling of the comparisons: the least a Go service
// can do to answer each kind of request the service answers, with no
// routing, validation, metrics or state.
//
//	trivial HTTP-ADDR [GRPC-ADDR LIMIT]
//
// On HTTP-ADDR it answers an acquire with net/http and encoding/json, an
// auth subrequest (/v1/forward-auth, any method) with a bare 200, and
// any other request with a 3-byte page, as the upstream behind a proxy. On GRPC-ADDR,
// if given, it answers Envoy's ShouldRateLimit with grpc-go and
// go-control-plane's types: OK, with one status OK under LIMIT per second
// for each descriptor, deciding nothing.
//
// It runs as the service does by default: with its heap floor
// (--gc-min-heap), and its gRPC calls on 32 stream workers per processor.
package main

import (
	"context"
	"encoding/json"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimiter/ratelimiter/internal/heapfloor"
)

type request struct {
	Permits int64 `json:"permits"`
}

type decision struct {
	Allowed      bool  `json:"allowed"`
	Permits      int64 `json:"permits"`
	Remaining    int64 `json:"remaining"`
	Limit        int64 `json:"limit"`
	ResetAfterMS int64 `json:"reset_after_ms"`
}

func main() {
	if len(os.Args) != 2 && len(os.Args) != 4 {
		log.Fatal("usage: trivial HTTP-ADDR [GRPC-ADDR LIMIT]")
	}
	heapfloor.Start(heapfloor.Default)
	http.HandleFunc("POST /v1/limiters/{name}/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(decision{Allowed: true, Permits: req.Permits, Remaining: 999, Limit: 1000, ResetAfterMS: 1})
	})
	// The auth service behind a proxy: every request may pass.
	http.HandleFunc("/v1/forward-auth", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	// The upstream of the proxy comparison: a page, as small as can be.
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	if len(os.Args) == 4 {
		limit, err := strconv.ParseUint(os.Args[3], 10, 32)
		if err != nil {
			log.Fatalf("LIMIT: %v", err)
		}
		l, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			log.Fatal(err)
		}
		s := grpc.NewServer(grpc.NumStreamWorkers(uint32(32 * runtime.GOMAXPROCS(0))))
		rlsv3.RegisterRateLimitServiceServer(s, rls{limit: uint32(limit)})
		go func() { log.Fatal(s.Serve(l)) }()
	}
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}

// rls answers every ShouldRateLimit call OK, with a status OK under limit
// per second for each descriptor.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	limit uint32
}

func (t rls) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors)),
	}
	limit := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: t.limit, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_OK, CurrentLimit: limit, LimitRemaining: t.limit - 1,
		}
	}
	return resp, nil
}
