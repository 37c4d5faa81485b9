// The "one house" pieces the engine is built on: typed configuration rows, the transport
// registry, the router that picks a transport per pair, and the communicator's topology.
#include "base/settings.hpp"
#include "core/config.hpp"
#include "core/router.hpp"
#include "core/topology.hpp"
#include "test_support.hpp"
#include "transport/registry.hpp"

#include <braid/config.hpp>
#include <braid/error.hpp>
#include <braid/store.hpp>
#include <gtest/gtest.h>

#include <map>
#include <set>

using namespace braid;
using namespace std::chrono_literals;

namespace {

base::Settings::Lookup env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Settings, DefaultsAreParsedFromTheRowLikeAUsersValue) {
  using base::SettingType;
  const std::vector<base::Setting> rows = {
      {"X_BYTES", SettingType::bytes, "4K", "h", true, 1024, 0, "", 1024},
      {"X_INT", SettingType::integer, "auto", "h", true, 0, 10, "auto"},
      {"X_ENUM", SettingType::choice, "Fast", "h", true, 0, 0, "fast|slow"},
      {"X_TIME", SettingType::duration, "2m", "h"},
      {"X_UNSET", SettingType::integer, "", "h", true, 1, 5},
      {"FOREIGN", SettingType::integer, "", "h", false, 0, 9},
  };
  auto s = base::Settings::parse(rows, env({}));
  EXPECT_EQ(s.bytes("X_BYTES"), 4096u);
  EXPECT_FALSE(s.integer("X_INT").has_value()) << "a keyword means unset";
  EXPECT_EQ(s.text("X_ENUM"), "fast") << "choices are kept lowercase";
  EXPECT_EQ(s.duration("X_TIME"), 2min);
  EXPECT_FALSE(s.integer("X_UNSET").has_value());
  EXPECT_FALSE(s.given("X_INT"));

  s = base::Settings::parse(rows, env({{"X_BYTES", "8K"}, {"X_INT", "7"}, {"X_ENUM", "SLOW"}, {"X_UNSET", ""}}));
  EXPECT_EQ(s.bytes("X_BYTES"), 8192u);
  EXPECT_EQ(s.integer("X_INT"), 7);
  EXPECT_EQ(s.text("X_ENUM"), "slow");
  EXPECT_FALSE(s.given("X_UNSET")) << "VAR= counts as unset";
  EXPECT_TRUE(s.given("X_INT"));
  EXPECT_EQ(s.raw("X_INT"), "7");

  // A bad braid value fails the parse, naming the variable and what is accepted.
  for (const auto& [k, v, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"X_BYTES", "1500", "multiple of 1024"},
           {"X_BYTES", "512", "at least 1024"},
           {"X_INT", "11", "an integer in [0, 10] or auto"},
           {"X_ENUM", "medium", "fast or slow"},
           {"X_TIME", "-1s", "positive duration"}}) {
    try {
      base::Settings::parse(rows, env({{k, v}}));
      ADD_FAILURE() << k << "=" << v << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
      EXPECT_TRUE(contains(e.what(), k + "='" + v + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), expected)) << e.what();
    }
  }
  // Another tool's malformed variable is an error only when braid reads it.
  s = base::Settings::parse(rows, env({{"FOREIGN", "x"}}));
  EXPECT_THROW(s.integer("FOREIGN"), Error);
  // Reading a variable that is not in the table, or as the wrong type, is a braid bug.
  EXPECT_THROW(s.integer("NOT_A_ROW"), Error);
  EXPECT_THROW(s.bytes("X_INT"), Error);
  // A default that does not parse is caught at the first parse.
  EXPECT_THROW(base::Settings::parse({{"X", SettingType::integer, "many", "h"}}, env({})), Error);
}

TEST(Registry, EveryTransportDeclaresItsRowsOnceInTheOneTable) {
  const auto& reg = transport::registry();
  ASSERT_FALSE(reg.empty());
  std::set<std::string> names;
  for (const auto* e : reg) {
    EXPECT_TRUE(names.insert(e->name).second) << e->name << " registered twice";
    EXPECT_EQ(transport::find_transport(e->name), e);
    EXPECT_NE(std::string(e->summary), "");
    for (const auto& row : e->settings) {
      int seen = 0;
      for (const auto& t : core::config_table()) seen += t.name == row.name;
      EXPECT_EQ(seen, 1) << row.name << " of " << e->name << " must appear once in the configuration table";
    }
  }
  EXPECT_NE(transport::find_transport("tcp"), nullptr);
#if BRAID_HAVE_SHM
  EXPECT_NE(transport::find_transport("shm"), nullptr);
#endif
  EXPECT_EQ(transport::find_transport("pigeon"), nullptr);
  // BRAID_TRANSPORT accepts exactly auto and the registered names.
  const auto parse = [](const std::string& v) {
    return core::Config::parse(env({{"BRAID_TRANSPORT", v}}));
  };
  for (const auto* e : reg) EXPECT_EQ(parse(e->name).transport, e->name);
  try {
    parse("pigeon");
    ADD_FAILURE() << "BRAID_TRANSPORT=pigeon accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "auto, tcp")) << "the message lists what the registry has: " << e.what();
  }
}

TEST(Router, PicksThePreferredTransportPerPairOrTheForcedOne) {
  const core::Router automatic("auto");
  const auto name = [](const core::Router& r, bool same) { return std::string(r.entries()[r.choose({0, 1, same})]->name); };
  EXPECT_EQ(name(automatic, false), "tcp");
#if BRAID_HAVE_SHM
  EXPECT_EQ(name(automatic, true), "shm");
  EXPECT_EQ(automatic.explain({0, 1, true}), "shm (same host)");
  // Forced: shm serves ranks of different host identities too (emulated hosts on one machine).
  const core::Router shm("shm");
  ASSERT_EQ(shm.entries().size(), 1u);
  EXPECT_EQ(name(shm, false), "shm");
  EXPECT_EQ(shm.explain({2, 3, false}), "shm (other host, BRAID_TRANSPORT=shm)");
#endif
#if BRAID_HAVE_UCX
  // The auto rule for RDMA: pairs on different hosts go over ucx when both ends have an
  // RDMA fabric (as their UCX reports it), else tcp; one host stays on shm either way.
  const auto with = [](const core::Router& r, bool same, bool rdma) {
    return std::string(r.entries()[r.choose({0, 1, same, rdma})]->name);
  };
  EXPECT_EQ(with(automatic, false, true), "ucx");
  EXPECT_EQ(with(automatic, false, false), "tcp");
  EXPECT_EQ(automatic.explain({0, 1, false, true}), "ucx (other host, RDMA fabric at both ends)");
#if BRAID_HAVE_SHM
  EXPECT_EQ(with(automatic, true, true), "shm");
#endif
#endif
#if BRAID_HAVE_IBVERBS
  // ibverbs serves a pair only when forced, so auto mode does not even make it (no device
  // is opened for a transport that would never be picked).
  for (const auto* e : automatic.entries()) EXPECT_STRNE(e->name, "ibverbs");
  const core::Router ibverbs("ibverbs");
  EXPECT_EQ(name(ibverbs, false), "ibverbs");
  EXPECT_EQ(name(ibverbs, true), "ibverbs");
#endif
  // A transport that cannot be made here (its library absent) is left out of auto mode.
  core::Router dropped("auto");
  const std::size_t n = dropped.entries().size();
  dropped.drop(0);
  ASSERT_EQ(dropped.entries().size(), n - 1);
  for (const auto* e : dropped.entries()) EXPECT_STRNE(e->name, automatic.entries()[0]->name);
  const core::Router tcp("tcp");
  EXPECT_EQ(name(tcp, true), "tcp");
  EXPECT_EQ(name(tcp, false), "tcp");
  try {
    core::Router bad("pigeon");
    ADD_FAILURE() << "a router for an unknown transport was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_TRUE(contains(e.what(), "pigeon")) << e.what();
    EXPECT_TRUE(contains(e.what(), transport::transport_names())) << e.what();
  }
}

TEST(Topology, ReadsEveryRanksHostOnceAndAnswersWithoutWaitingWhenAsked) {
  auto store = std::make_shared<FileStore>(test::temp_path("topology"));
  // Ranks 0..3 on hosts a, b, a, b; rank 3 joins late.
  core::Topology t0(store, 0, 4, "a", 2s);
  core::Topology t1(store, 1, 4, "b", 2s);
  core::Topology t2(store, 2, 4, "a", 2s);
  EXPECT_EQ(t0.same_host(2), std::optional<bool>(true));
  EXPECT_EQ(t0.same_host(1), std::optional<bool>(false));
  EXPECT_FALSE(t0.same_host(3).has_value()) << "rank 3 has not published: the router tries later";
  core::Topology t3(store, 3, 4, "b", 2s);
  EXPECT_EQ(t0.same_host(3), std::optional<bool>(false));
  const core::Layout& l = t3.layout();
  EXPECT_EQ(l.host_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(l.hosts(), 2);
  EXPECT_EQ(l.host_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(l.ranks_of_host[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_TRUE(l.uniform());
  EXPECT_EQ(*t2.host_of(), l.host_of);
  EXPECT_EQ(&t3.layout(), &l) << "computed once";
  EXPECT_EQ(core::Topology::local_host_id("emulated"), "emulated");
  EXPECT_FALSE(t0.has_rdma(1)) << "published without a fabric";
}

TEST(Topology, EachRanksFabricIsPublishedSoBothEndsOfAPairAgree) {
  auto store = std::make_shared<FileStore>(test::temp_path("topology-rdma"));
  core::Topology t0(store, 0, 3, "a", 2s, true);
  core::Topology t1(store, 1, 3, "b", 2s, true);
  core::Topology t2(store, 2, 3, "c", 2s, false);
  ASSERT_TRUE(t0.same_host(1).has_value());
  EXPECT_TRUE(t0.has_rdma(0));
  EXPECT_TRUE(t0.has_rdma(1)) << "0 and 1 both have RDMA: ucx between them, from both ends";
  EXPECT_TRUE(t1.has_rdma(0));
  EXPECT_FALSE(t0.has_rdma(2)) << "2 has none: its pairs stay on tcp, from both ends";
  EXPECT_FALSE(t2.has_rdma(2));
  EXPECT_TRUE(t2.has_rdma(0));
  EXPECT_TRUE(contains(core::Topology::local_host_id(""), "/")) << "hostname/boot id";
}

TEST(Topology, ARankThatNeverJoinsIsNamedWhenTheLayoutIsNeeded) {
  auto store = std::make_shared<FileStore>(test::temp_path("topology-late"));
  core::Topology t0(store, 0, 3, "a", 300ms);
  core::Topology t1(store, 1, 3, "a", 300ms);
  try {
    (void)t0.layout();
    ADD_FAILURE() << "layout() returned without rank 2";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 2 did not publish its host")) << e.what();
  }
}
