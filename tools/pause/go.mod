// Module pause is the test cluster's pod sandbox: the process that holds a
// pod's namespaces while its containers come and go. No registry can be
// reached, so scripts/cluster-up.sh builds it into a local image.
module github.com/ratelimiter/ratelimiter/tools/pause

go 1.26.0
