// Package etcdtest runs a real, single-member etcd server inside the test
// process.
//
// Invariant: clients never talk to etcd directly but through a loopback TCP
// forwarder owned by the Server (a Link). That is what keeps the endpoint
// stable across Stop/Restart (etcd itself binds fresh ports each start) and
// what lets Stop behave like a crash seen from the network: every client
// connection is severed at once instead of etcd waiting out its graceful
// shutdown timeout (more than five seconds) for open watch streams. Extra
// Links give a test a network path it can cut and mend on its own while
// the server keeps running, to produce faults such as a watcher that misses
// a compaction.
//
// Units: timeouts are time.Duration; endpoints are "host:port" strings.
package etcdtest
