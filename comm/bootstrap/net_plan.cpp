#include "comm/bootstrap/net_plan.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace troupe::comm {

namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::vector<NetInterface> system_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    out.push_back({i->ifa_name, numeric(i->ifa_addr)});
  }
  ::freeifaddrs(list);
  return out;
}

Result<std::vector<std::string>> system_resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list); rc != 0)
    return rc == EAI_AGAIN ? Status::error(gai_strerror(rc)) : Status::bad_input(gai_strerror(rc));
  std::vector<std::string> out;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    const std::string a = numeric(ai->ai_addr);
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  ::freeaddrinfo(list);
  // IPv4 first: CAF and UCX try addresses in this order too.
  std::stable_partition(out.begin(), out.end(),
                        [](const std::string& a) { return a.find(':') == std::string::npos; });
  return out;
}

Result<std::string> system_source_addr(const std::string& addr) {
  sockaddr_storage dst{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&dst);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&dst);
  if (::inet_pton(AF_INET, addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(9);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, addr.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(9);
    len = sizeof *v6;
  } else {
    return Status::error("'" + addr + "' is not a numeric address");
  }
  // A UDP connect sends nothing: it only asks the kernel for the route and its source address.
  const int fd = ::socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::error(std::strerror(errno));
  sockaddr_storage src{};
  socklen_t src_len = sizeof src;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&dst), len) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&src), &src_len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::error(std::string("no route: ") + std::strerror(err));
  return numeric(reinterpret_cast<sockaddr*>(&src));
}

std::vector<std::string> system_rdma_ports() {
  std::vector<std::string> out;
  std::error_code ec;
  const std::filesystem::path root = "/sys/class/infiniband";
  for (const auto& dev : std::filesystem::directory_iterator(root, ec)) {
    std::error_code ec2;
    for (const auto& port : std::filesystem::directory_iterator(dev.path() / "ports", ec2))
      out.push_back(dev.path().filename().string() + ":" + port.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The interface holding `addr`, or "".
std::string interface_of(const std::vector<NetInterface>& ifs, const std::string& addr) {
  for (const auto& i : ifs)
    if (i.addr == addr) return i.name;
  return "";
}

bool is_wildcard(const std::string& addr) {
  return addr == "0.0.0.0" || addr == "::";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

bool is_loopback_address(const std::string& addr) {
  in_addr v4{};
  if (::inet_pton(AF_INET, addr.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

NetQueries system_net_queries() {
  return {system_interfaces, system_resolve, system_source_addr, system_rdma_ports};
}

std::string NetworkPlan::summary() const {
  std::string s = one_host ? "one host" : "several hosts";
  s += ": rendezvous on " + bind_addr + ", reached at " + connect_addr;
  s += ucx_net_devices.empty() ? ", UCX_NET_DEVICES left to UCX"
                               : ", UCX_NET_DEVICES=" + ucx_net_devices;
  return s;
}

Result<NetworkPlan> plan_network(const LaunchEnv& env, const EnvLookup& lookup,
                                 const NetQueries& q) {
  const std::string master = env.master_addr;
  const auto bind_override = lookup("TROUPE_BIND_ADDR");
  const auto if_override = lookup("TROUPE_NET_IFNAME");
  const bool user_ucx_devices = lookup("UCX_NET_DEVICES").has_value();
  const bool single_node = env.local_world_size == env.world_size;
  const std::vector<NetInterface> ifs = q.interfaces();

  std::string if_addr;  // the override interface's first address (IPv4 first)
  if (if_override) {
    for (const auto& i : ifs)
      if (i.name == *if_override && (if_addr.empty() || if_addr.find(':') != std::string::npos))
        if_addr = i.addr;
    if (if_addr.empty()) {
      std::vector<std::string> names;
      for (const auto& i : ifs)
        if (std::find(names.begin(), names.end(), i.name) == names.end()) names.push_back(i.name);
      return Status::bad_input("TROUPE_NET_IFNAME=" + *if_override +
                               " is not an interface with an address on this host (it has " +
                               join(names) + ") -- name one of them or unset it");
    }
  }

  auto resolved = q.resolve(master);
  if (!resolved || resolved->empty()) {
    const std::string why = "MASTER_ADDR '" + master + "' does not resolve on this host (" +
                            (resolved ? std::string("no address") : resolved.status().message()) +
                            ") -- set MASTER_ADDR (troupe launch --master-addr) to a name this "
                            "host resolves, or to rank 0's IP address";
    // A temporary failure of the name service is the run's, not the input's.
    const bool temporary = !resolved && !resolved.status().is_bad_input();
    return temporary ? Status::error(why) : Status::bad_input(why);
  }
  bool all_loopback = true, local = false;
  std::string local_addr;  // the first resolved address of this host that is not loopback
  for (const auto& a : *resolved) {
    all_loopback = all_loopback && is_loopback_address(a);
    if (is_loopback_address(a)) local = true;
    if (!interface_of(ifs, a).empty()) {
      local = true;
      if (local_addr.empty() && !is_loopback_address(a)) local_addr = a;
    }
  }

  NetworkPlan p;
  if (all_loopback || (single_node && local)) {
    if (!single_node)
      return Status::bad_input(
          "MASTER_ADDR '" + master +
          "' is (or resolves only to) a loopback address, but the job "
          "spans several hosts (" +
          std::to_string(env.local_world_size) + " of its " + std::to_string(env.world_size) +
          " ranks run here) -- set MASTER_ADDR (troupe launch --master-addr) to the network "
          "address or name of rank 0's host");
    p.one_host = true;
    const bool v6 = master.find(':') != std::string::npos && is_loopback_address(master);
    p.bind_addr = bind_override ? *bind_override : if_override ? if_addr : v6 ? "::1" : "127.0.0.1";
    p.connect_addr = is_wildcard(p.bind_addr) ? (v6 ? "::1" : "127.0.0.1") : p.bind_addr;
    p.ifname = if_override ? *if_override : "lo";
    if (!user_ucx_devices) p.ucx_net_devices = p.ifname;
    return p;
  }

  p.one_host = false;
  p.connect_addr = master;
  if (env.rank == 0) {
    if (bind_override) {
      p.bind_addr = *bind_override;
    } else if (if_override) {
      p.bind_addr = if_addr;
    } else if (!local_addr.empty()) {
      p.bind_addr = local_addr;
    } else if (local) {
      return Status::bad_input(
          "MASTER_ADDR '" + master + "' resolves on rank 0's host only to loopback addresses (" +
          join(*resolved) +
          "), which the other hosts cannot reach -- set MASTER_ADDR to this "
          "host's network address, fix its line in /etc/hosts, or set TROUPE_BIND_ADDR");
    } else {
      return Status::bad_input(
          "MASTER_ADDR '" + master + "' (" + join(*resolved) +
          ") is not an address of this host, where rank 0 runs -- set MASTER_ADDR to rank 0's "
          "host (troupe launch --master-addr on every node), or TROUPE_BIND_ADDR to the address "
          "to listen on (0.0.0.0 for every interface)");
    }
  }
  if (if_override) {
    p.ifname = *if_override;
  } else if (env.rank == 0 && !is_wildcard(p.bind_addr)) {
    p.ifname = interface_of(ifs, p.bind_addr);
  } else {
    // The interface of the source address this host uses toward rank 0.
    const std::string target = !local_addr.empty() ? local_addr : resolved->front();
    if (auto src = q.source_addr(target)) p.ifname = interface_of(ifs, *src);
  }
  if (!user_ucx_devices && !p.ifname.empty()) {
    p.ucx_net_devices = p.ifname;
    for (const auto& port : q.rdma_ports()) p.ucx_net_devices += "," + port;
  }
  return p;
}

}  // namespace troupe::comm
