// Command coredns is CoreDNS with only the plugins the test cluster's
// Corefile uses (scripts/cluster-up.sh): it answers the cluster.local
// names from the Kubernetes API and refuses every other name, so no query
// leaves the machine. Upstream's own main links every plugin it has.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

func main() {
	coremain.Run()
}
