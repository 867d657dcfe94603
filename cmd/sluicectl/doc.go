// Command sluicectl is the operator CLI of Sluice: it validates and applies
// the config kept in etcd, edits tenants and shadow mode, and shows who
// leads and how the global tier divides the contended keys.
//
//	sluicectl [global flags] <command> [flags] [args]
//
//	validate -f FILE                 check a config offline
//	apply -f FILE [-yes] [-dry-run] [-takeover]
//	                                 show the diff and write the config
//	get [-o yaml|json]               print the config in etcd
//	status [-top N] [-o text|json]   leaders and the global allocation
//	tenant get NAME                  a tenant's tier, overrides and limits (one
//	                                 not listed: exit 4, default_tier's limits shown)
//	tenant set NAME [-tier T] [-shadow=true|false] [-override class=rate,burst ...]
//	tenant delete NAME               stop listing a tenant
//	tenant list [-prefix P]          stored tenants, one per line
//	shadow set (class NAME | tenant NAME) on|off
//	region drain NAME                run the region on its floor, its share to the others
//	region restore NAME              undo a drain
//	lease -tenant T [-class C]       take and release one lease from a regional service
//	check -tenant T [-class C]       one strict decision (exit 6 when denied)
//	import envoy-ratelimit DIR       envoyproxy/ratelimit config files into the config
//	                                 (in etcd, or -base FILE -o FILE|- without etcd)
//
// "sluicectl tenant -h" (shadow, region, import) lists a group's subcommands.
//
// Global flags may also come after the command. Each global flag can be set
// from the environment: -etcd-endpoints from SLUICE_ETCD_ENDPOINTS,
// -global-addr from SLUICE_GLOBAL_ADDR, -etcd-password from
// SLUICE_ETCD_PASSWORD, and so on; the command line wins.
//
// Exit codes:
//
//	0  success (including "no changes")
//	1  invalid input or config, or a change declined at the prompt
//	2  usage error, found before anything is asked or written: an address that is
//	   not host:port, a number out of its range (lease -want 1..1073741824, check
//	   -cost 1..1048576, status -top 1..1000, tenant list -limit 0 or more,
//	   -timeout above 0); a change without -yes when stdin is not a terminal, too
//	3  conflict: the config in etcd changed between read and write
//	4  not found: no config in etcd, or no such tenant, class or region (lease and
//	   check against a replica whose region is no longer in the config it runs, too)
//	5  unreachable: etcd, the global allocator or the regional service could not be reached
//	   (status during a global failover too, while etcd still names the
//	   leader that is gone: the message says so; run it again)
//	6  denied: check answered over quota (a result, not a failure)
//	7  refused: the service answered but refused this client's credentials,
//	   closed a connection made without -tls-ca, as a TLS listener does, or
//	   asked for the client certificate -tls-cert/-tls-key did not give
//	130 interrupted by SIGINT or SIGTERM
//
// Invariant: every write is guarded by the revision the change was
// computed from (configstore.Store.ApplyWith), made only after the new
// config validated and its diff was shown; an invalid config, a lost race
// or a declined prompt writes nothing. A write is one etcd transaction,
// except an apply of more tenant changes than one transaction holds, which
// writes them in batches that no daemon sees before the last transaction
// commits them all (an interrupted one is finished by apply -takeover).
// Tenant commands write one tenant's key, not the whole config; before
// writing they check the other stored tenants against the document (a
// page at a time) and refuse to write on top of a stored config that does
// not validate, which every daemon refuses. region drain/restore of a
// region already in that state writes nothing and succeeds; draining the
// last region not drained is refused.
//
// Units: rates are tokens per second, written like "10/s", "6/m",
// "1000/h" or "5/d"; bursts are whole tokens; ages and validities are shown as
// durations; -timeout bounds each etcd or gRPC step, not the prompt.
package main
