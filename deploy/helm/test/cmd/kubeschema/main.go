// Command kubeschema writes strict JSON schemas of the Kubernetes API kinds
// for kubeconform, from the swagger.json of the k8s.io/kubernetes module (see
// package kubeschema). The chart's tests generate them on their own; this
// command is for running kubeconform by hand:
//
//	go run ./cmd/kubeschema -out /tmp/k8s-schemas
//	helm template rel ../ratelimiter --kube-version v1.37.2 |
//	  go tool kubeconform -strict -summary \
//	    -schema-location '/tmp/k8s-schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json' -
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ratelimiter/ratelimiter/deploy/helm/test/kubeschema"
)

func main() {
	out := flag.String("out", "", "directory to write the schemas into (created if missing)")
	version := flag.String("kubernetes-version", kubeschema.DefaultVersion, "version of the k8s.io/kubernetes module whose swagger.json is read")
	swagger := flag.String("swagger", "", "path of a swagger.json to read instead of the module's")
	flag.Parse()
	if err := run(*out, *version, *swagger); err != nil {
		fmt.Fprintln(os.Stderr, "kubeschema:", err)
		os.Exit(1)
	}
}

func run(out, version, swagger string) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	if swagger == "" {
		var err error
		if swagger, err = kubeschema.SwaggerPath(version); err != nil {
			return err
		}
	}
	doc, err := os.ReadFile(swagger)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	kinds, err := kubeschema.Generate(doc, out, nil)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %d schemas to %s\n", len(kinds), out)
	return nil
}
