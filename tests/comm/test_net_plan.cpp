// The network plan (comm/bootstrap/net_plan.hpp): what a job binds, connects to and gives UCX, on a fake
// host (interfaces, name resolution and routes given by the test) and on this machine's loopback.
#include <catch2/catch.hpp>
#include <map>

#include "comm/bootstrap/net_plan.hpp"

namespace troupe::comm {
namespace {

using Catch::Contains;

// A host "node0" with lo, eth0 (10.0.0.5) and ib0 (192.168.7.5); names resolve as in `names`.
struct FakeHost {
  std::vector<NetInterface> ifs = {{"lo", "127.0.0.1"},
                                   {"lo", "::1"},
                                   {"eth0", "10.0.0.5"},
                                   {"eth0", "fe80::5"},
                                   {"ib0", "192.168.7.5"}};
  std::map<std::string, std::vector<std::string>> names = {{"127.0.0.1", {"127.0.0.1"}},
                                                           {"localhost", {"127.0.0.1", "::1"}},
                                                           {"::1", {"::1"}},
                                                           {"node0", {"10.0.0.5"}},
                                                           {"node0-ib", {"192.168.7.5"}},
                                                           {"node1", {"10.0.0.6"}},
                                                           {"10.0.0.6", {"10.0.0.6"}},
                                                           {"debian-self", {"127.0.1.1"}},
                                                           {"10.0.0.5", {"10.0.0.5"}}};
  std::map<std::string, std::string> routes = {{"10.0.0.6", "10.0.0.5"}, {"10.0.0.5", "10.0.0.5"}};
  std::vector<std::string> rdma = {"mlx5_0:1"};

  NetQueries queries() const {
    NetQueries q;
    q.interfaces = [this] { return ifs; };
    q.resolve = [this](const std::string& h) -> Result<std::vector<std::string>> {
      auto it = names.find(h);
      if (it == names.end()) return Status::bad_input("Name or service not known");
      return it->second;
    };
    q.source_addr = [this](const std::string& a) -> Result<std::string> {
      auto it = routes.find(a);
      if (it == routes.end()) return Status::error("no route");
      return it->second;
    };
    q.rdma_ports = [this] { return rdma; };
    return q;
  }
};

LaunchEnv env(int rank, int world, int local_world, const std::string& master) {
  LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank % local_world;
  e.local_world_size = local_world;
  e.master_addr = master;
  e.token = "0123456789abcdef0123";
  return e;
}

Result<NetworkPlan> plan(const FakeHost& h, const LaunchEnv& e,
                         std::map<std::string, std::string> vars = {}) {
  return plan_network(e, map_env(std::move(vars)), h.queries());
}

TEST_CASE("a one-host job binds loopback only and gives UCX the loopback interface", "[net_plan]") {
  FakeHost h;
  // Loopback masters, this host's name and its address: all one host when every rank is here.
  for (const std::string master : {"127.0.0.1", "localhost", "node0", "10.0.0.5"}) {
    for (int rank : {0, 3}) {
      INFO("MASTER_ADDR " << master << ", rank " << rank);
      auto p = plan(h, env(rank, 4, 4, master));
      REQUIRE(p);
      CHECK(p->one_host);
      CHECK(p->bind_addr == "127.0.0.1");
      CHECK(p->connect_addr == "127.0.0.1");
      CHECK(p->ifname == "lo");
      CHECK(p->ucx_net_devices == "lo");
    }
  }
  auto v6 = plan(h, env(0, 2, 2, "::1"));
  REQUIRE(v6);
  CHECK(v6->bind_addr == "::1");
  CHECK(v6->connect_addr == "::1");
  // The user's UCX_NET_DEVICES wins; TROUPE_BIND_ADDR moves the listener (a wildcard keeps the
  // others on loopback).
  auto user = plan(h, env(1, 2, 2, "127.0.0.1"), {{"UCX_NET_DEVICES", "eth0"}});
  REQUIRE(user);
  CHECK(user->ucx_net_devices == "");
  auto wild = plan(h, env(1, 2, 2, "127.0.0.1"), {{"TROUPE_BIND_ADDR", "0.0.0.0"}});
  REQUIRE(wild);
  CHECK(wild->bind_addr == "0.0.0.0");
  CHECK(wild->connect_addr == "127.0.0.1");
}

TEST_CASE("a multi-host job binds the address MASTER_ADDR names and the interface toward it",
          "[net_plan]") {
  FakeHost h;
  // Rank 0 on node0, MASTER_ADDR a hostname.
  auto r0 = plan(h, env(0, 4, 2, "node0"));
  REQUIRE(r0);
  CHECK_FALSE(r0->one_host);
  CHECK(r0->bind_addr == "10.0.0.5");
  CHECK(r0->connect_addr == "node0");
  CHECK(r0->ifname == "eth0");
  CHECK(r0->ucx_net_devices == "eth0,mlx5_0:1");  // RDMA ports stay usable
  // Rank 1, also on node0: the same interface.
  auto r1 = plan(h, env(1, 4, 2, "node0"));
  REQUIRE(r1);
  CHECK(r1->ifname == "eth0");
  CHECK(r1->bind_addr.empty());  // only rank 0 listens
  // A rank on node1 (fake: its route to node1's rank 0 leaves from 10.0.0.5 -> eth0).
  h.names["node0"] = {"10.0.0.6"};
  h.ifs.erase(h.ifs.begin() + 2);  // 10.0.0.5 is not ours any more
  h.ifs.push_back({"eth0", "10.0.0.7"});
  h.routes["10.0.0.6"] = "10.0.0.7";
  auto r2 = plan(h, env(2, 4, 2, "node0"));
  REQUIRE(r2);
  CHECK(r2->connect_addr == "node0");
  CHECK(r2->ifname == "eth0");
  // Over InfiniBand's IP interface when MASTER_ADDR names it.
  FakeHost ib;
  auto rib = plan(ib, env(0, 4, 2, "node0-ib"));
  REQUIRE(rib);
  CHECK(rib->bind_addr == "192.168.7.5");
  CHECK(rib->ifname == "ib0");
}

TEST_CASE("overrides: TROUPE_BIND_ADDR, TROUPE_NET_IFNAME, UCX_NET_DEVICES", "[net_plan]") {
  FakeHost h;
  auto all = plan(h, env(0, 4, 2, "node0"), {{"TROUPE_BIND_ADDR", "0.0.0.0"}});
  REQUIRE(all);
  CHECK(all->bind_addr == "0.0.0.0");
  auto viaif = plan(h, env(0, 4, 2, "node0"), {{"TROUPE_NET_IFNAME", "ib0"}});
  REQUIRE(viaif);
  CHECK(viaif->bind_addr == "192.168.7.5");
  CHECK(viaif->ucx_net_devices == "ib0,mlx5_0:1");
  auto mine = plan(h, env(0, 4, 2, "node0"), {{"UCX_NET_DEVICES", "mlx5_1:1"}});
  REQUIRE(mine);
  CHECK(mine->ucx_net_devices == "");
  auto bad = plan(h, env(0, 4, 2, "node0"), {{"TROUPE_NET_IFNAME", "wlan9"}});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.status().message(), Contains("TROUPE_NET_IFNAME=wlan9"));
  CHECK_THAT(bad.status().message(), Contains("eth0"));
}

TEST_CASE("unusable masters are refused naming the fix", "[net_plan]") {
  FakeHost h;
  auto unknown = plan(h, env(1, 4, 2, "nowhere"));
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.status().message(), Contains("'nowhere' does not resolve"));
  CHECK(unknown.status().is_bad_input());
  // Debian's "127.0.1.1 hostname" line: the other hosts could not reach rank 0.
  auto debian = plan(h, env(0, 4, 2, "debian-self"));
  REQUIRE_FALSE(debian);
  CHECK_THAT(debian.status().message(), Contains("loopback"));
  auto loop = plan(h, env(0, 4, 2, "127.0.0.1"));
  REQUIRE_FALSE(loop);
  CHECK_THAT(loop.status().message(), Contains("spans several hosts"));
  auto elsewhere = plan(h, env(0, 4, 2, "node1"));  // rank 0 started on the wrong host
  REQUIRE_FALSE(elsewhere);
  CHECK_THAT(elsewhere.status().message(), Contains("not an address of this host"));
  CHECK_THAT(elsewhere.status().message(), Contains("TROUPE_BIND_ADDR"));
  CHECK(elsewhere.status().is_bad_input());
}

TEST_CASE("on this machine: loopback resolves and routes through lo", "[net_plan]") {
  auto p = plan_network(env(0, 2, 2, "127.0.0.1"), map_env({}));
  REQUIRE(p);
  CHECK(p->bind_addr == "127.0.0.1");
  CHECK(p->ucx_net_devices == "lo");
  const NetQueries q = system_net_queries();
  auto src = q.source_addr("127.0.0.1");
  REQUIRE(src);
  CHECK(*src == "127.0.0.1");
  bool has_lo = false;
  for (const auto& i : q.interfaces()) has_lo = has_lo || (i.name == "lo" && i.addr == "127.0.0.1");
  CHECK(has_lo);
  CHECK(is_loopback_address("127.0.1.1"));
  CHECK(is_loopback_address("::1"));
  CHECK(is_loopback_address("::ffff:127.0.0.1"));
  CHECK_FALSE(is_loopback_address("10.0.0.1"));
  CHECK_FALSE(is_loopback_address("localhost"));  // a name, not an address
}

}  // namespace
}  // namespace troupe::comm
