# The ratelimiter image: a static binary on an empty base.
#
#   docker build -t ratelimiter \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) .
#
# The base images are build arguments so that the same file builds offline
# from locally made images (scripts/images.sh does that); by default they are
# the usual public ones.
ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=scratch

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0
# Modules first, so that this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# grpcnotrace: gRPC (linked by the OTLP exporter) otherwise links
# golang.org/x/net/trace and its html/template, whose reflection keeps every
# method of every type in the binary: about 10 MB of the image.
RUN go build -trimpath -buildvcs=false -tags grpcnotrace \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/ratelimiter ./cmd/service \
 && /out/ratelimiter --version
# An empty directory for --data-dir, which the runtime stage gives to the
# service's user: a volume mounted there (docker run -v NAME:/var/lib/ratelimiter)
# starts writable. WORKDIR makes it without a shell, which the base may lack.
WORKDIR /out/data

FROM ${RUNTIME_IMAGE}
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="ratelimiter" \
      org.opencontainers.image.description="Rate-limiting HTTP service: all-or-nothing permits per named limiter and per requester IP" \
      org.opencontainers.image.source="https://github.com/ratelimiter/ratelimiter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
# CA certificates for an OTLP exporter reached over TLS.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/ratelimiter /ratelimiter
COPY --from=build --chown=65532:65532 /out/data /var/lib/ratelimiter
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/ratelimiter"]
