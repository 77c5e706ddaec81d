// Command trivial is the ceiling of the HTTP comparisons: the least a Go
// service can do to answer an acquire, net/http and encoding/json with no
// routing, validation, metrics or state. It listens on the address given as
// its only argument.
package main

import (
	"encoding/json"
	"log"
	"net/http"
	"os"
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
	http.HandleFunc("POST /v1/limiters/{name}/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(decision{Allowed: true, Permits: req.Permits, Remaining: 999, Limit: 1000, ResetAfterMS: 1})
	})
	// The upstream of the proxy comparison: a page, as small as can be.
	http.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}
