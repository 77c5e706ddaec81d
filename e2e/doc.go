// Package e2e is the end-to-end suite of ratelimiter: it builds the service's
// container image from the project's Dockerfile, runs it with
// testcontainers-go, and drives it only through the generated Go client, as a
// user would.
//
// It is a module of its own, so that testcontainers never enters the
// service's dependencies. Run it from this directory:
//
//	go test -race -count=1 -v ./...
//
// The image is built once per run (tagged ratelimiter:e2e) and every container
// runs it. Building needs no registry when RATELIMITER_E2E_GO_IMAGE names a
// local Go toolchain image, which is passed to the Dockerfile as GO_IMAGE
// (scripts/images.sh toolchain makes one); unset, the Dockerfile's default
// base image is used.
//
// Without a Docker engine the suite skips every test and says so loudly; with
// CI=true it fails instead.
package e2e
