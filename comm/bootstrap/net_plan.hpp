// Which addresses a job's processes bind and connect to, and which network interface UCX may use
// (docs/COMM.md, "Security model"). Every rank computes the same plan from its launch
// environment, so they agree without talking.
//
// One host: every rank runs on this host (local world size == world size) and MASTER_ADDR names
// it (a loopback address, this host's name or one of its addresses), or MASTER_ADDR is a loopback
// address. Rank 0 listens on 127.0.0.1 (::1 for an IPv6 loopback master), the others connect
// there, and UCX gets the loopback interface only (UCX_NET_DEVICES=lo; shared memory is not a
// network device and stays available). Nothing binds another interface.
//
// Several hosts: the other ranks connect to MASTER_ADDR. Rank 0 listens on the address that
// MASTER_ADDR resolves to on its own host (hostnames included); if it resolves there only to
// loopback addresses (Debian's "127.0.1.1 hostname" line) or to no address of this host, planning
// fails naming the fix. UCX gets the interface that reaches MASTER_ADDR: on rank 0's host the one
// holding that address, elsewhere the one holding the source address the kernel picks for it,
// plus every RDMA port in /sys/class/infiniband (so InfiniBand/RoCE stay usable).
//
// Overrides (environment, the same on every rank): TROUPE_BIND_ADDR is rank 0's listening address
// (0.0.0.0 or :: for every interface; on one host the others then connect to it, or to 127.0.0.1
// for a wildcard); TROUPE_NET_IFNAME names the interface for UCX (and, without TROUPE_BIND_ADDR,
// gives rank 0 its address to listen on). A UCX_NET_DEVICES set by the user wins over the plan's.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "comm/bootstrap/launch_env.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

struct NetworkPlan {
  bool one_host = true;
  std::string bind_addr;        // rank 0's listening address
  std::string connect_addr;     // where ranks reach rank 0's rendezvous
  std::string ifname;           // the interface toward rank 0 ("lo" on one host); "" if unknown
  std::string ucx_net_devices;  // for UCX_NET_DEVICES; "" = leave UCX's choice (user's setting)
  // "one host: rendezvous on 127.0.0.1, UCX_NET_DEVICES=lo" and the like.
  std::string summary() const;
};

struct NetInterface {
  std::string name;  // "eth0"
  std::string addr;  // numeric, "10.0.0.5" or "fe80::1"
};

// The system calls the plan needs, replaceable in tests.
struct NetQueries {
  std::function<std::vector<NetInterface>()> interfaces;  // getifaddrs, IPv4 and IPv6
  // Numeric addresses of `host` (getaddrinfo; a literal address resolves to itself).
  std::function<Result<std::vector<std::string>>(const std::string& host)> resolve;
  // The local address the kernel would send from to reach `addr` (a UDP connect + getsockname).
  std::function<Result<std::string>(const std::string& addr)> source_addr;
  std::function<std::vector<std::string>()> rdma_ports;  // "mlx5_0:1", ...
};

NetQueries system_net_queries();

bool is_loopback_address(const std::string& addr);

// Errors name MASTER_ADDR / the override and the fix; they are bad input (exit code 2), except
// a temporary failure of the name service (EAI_AGAIN: a run-time error).
Result<NetworkPlan> plan_network(const LaunchEnv& env, const EnvLookup& lookup = process_env(),
                                 const NetQueries& queries = system_net_queries());

}  // namespace troupe::comm
