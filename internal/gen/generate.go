// Package gen holds the code oapi-codegen generates from api/openapi.yaml for
// the server: the models (types.gen.go) and the strict chi server
// (server.gen.go). The handlers that implement it live in internal/httpapi.
//
// Never edit the generated files: change the spec or a config and run
// go generate ./... from the module root.
package gen

//go:generate go tool oapi-codegen -config types.cfg.yaml ../../api/openapi.yaml
//go:generate go tool oapi-codegen -config server.cfg.yaml ../../api/openapi.yaml
