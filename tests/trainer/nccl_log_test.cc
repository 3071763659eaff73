// The NCCL INFO log parser on real logs from public issue threads (tests/trainer/fixtures/nccl/,
// each naming its source), its limits on hostile input, the trainer's environment plan, and the
// whole path of a log file to a `topology` event and back into the coordinator's typed report.
#include "worker/trainer/diagnostics/nccl_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "common/diagnostics_reports.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainctl::trainer {
namespace {

namespace v1 = trainctl::v1;
namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

std::string Fixture(const std::string& name) {
  std::ifstream in(fs::path(TRAINCTL_NCCL_FIXTURES) / name, std::ios::binary);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Connections(const v1::NcclReport& r) {
  std::string out;
  for (const v1::NcclConnection& c : r.connections()) {
    out += std::to_string(c.channel()) + ":" + std::to_string(c.from_rank()) + "->" +
           std::to_string(c.to_rank()) + " " + v1::NcclTransport_Name(c.transport()) +
           (c.gdrdma() ? " gdr" : "") + (c.inter_node() ? " net" : "") +
           (c.nic().empty() ? "" : " nic" + c.nic()) + ";";
  }
  return out;
}

TEST(NcclLogTest, TwoNodeIbRunWithGdrdmaSeenFromARankWithNetConnections) {
  // Rank 14 (machine-1, GPU 6) receives from rank 7 on the other node and sends to rank 6 there.
  const v1::NcclReport r = ParseNcclLog(Fixture("ib_gdrdma_two_nodes_2.8.log"), 14);
  EXPECT_EQ(r.rank(), 14);
  EXPECT_EQ(r.nccl_version(), "2.8.3+cuda10.2");
  EXPECT_EQ(Connections(r),
            "3:7->14 NCCL_TRANSPORT_NET_IB gdr net nic0;"
            "1:14->6 NCCL_TRANSPORT_NET_IB gdr net nic0;"
            "2:14->6 NCCL_TRANSPORT_NET_IB gdr net nic0;"
            "3:14->6 NCCL_TRANSPORT_NET_IB gdr net nic0;");
  EXPECT_EQ(r.connections(0).via(), "NET/IB/0/GDRDMA");
  EXPECT_EQ(r.gdr_state(), "enabled");
  EXPECT_FALSE(r.ib_disabled());
  EXPECT_EQ(r.env().at("NCCL_IB_DISABLE"), "0");
  EXPECT_THAT(r.nics(), ElementsAre("mlx5_bond_0:1/RoCE"));
  EXPECT_EQ(r.bootstrap_interface(), "eth0:10.11.170.43<0>");
}

TEST(NcclLogTest, TwoNodeIbRunSeenFromARankWithItsCommunicatorLine) {
  // Rank 5 (machine-2, GPU 5): its own communicator line, its process's NIC and environment lines
  // (not machine-1's), and only its P2P connections inside the node.
  const v1::NcclReport r = ParseNcclLog(Fixture("ib_gdrdma_two_nodes_2.8.log"), 5);
  EXPECT_EQ(r.rank(), 5);
  EXPECT_EQ(r.host(), "machine-2");
  EXPECT_EQ(r.nranks(), 16);
  EXPECT_EQ(r.cuda_device(), 5);
  EXPECT_EQ(r.bus_id(), "89000");
  EXPECT_EQ(r.nchannels(), 6);
  EXPECT_EQ(Connections(r), "1:5->7 NCCL_TRANSPORT_P2P;2:5->7 NCCL_TRANSPORT_P2P;");
  EXPECT_EQ(r.connections(0).via(), "P2P/direct pointer");
  EXPECT_EQ(r.gdr_state(), "");  // no NET connection of its own
  EXPECT_THAT(r.nics(), ElementsAre("mlx5_bond_0:1/RoCE"));
  EXPECT_THAT(r.env(),
              UnorderedElementsAre(Pair("NCCL_IB_GID_INDEX", "3"), Pair("NCCL_SHM_DISABLE", "0")));
  EXPECT_EQ(r.bootstrap_interface(), "");  // only machine-1's bootstrap line is in the log
}

TEST(NcclLogTest, SocketFallbackWithIbDisabledByTheEnvironment) {
  const v1::NcclReport r = ParseNcclLog(Fixture("socket_fallback_2.25.log"), 1);
  EXPECT_EQ(r.rank(), 1);
  EXPECT_EQ(r.host(), "agzen-worker");
  EXPECT_EQ(r.nccl_version(), "2.25.1+cuda12.1");
  EXPECT_EQ(r.nranks(), 2);
  EXPECT_EQ(r.cuda_device(), 0);
  EXPECT_EQ(r.bus_id(), "1000");
  EXPECT_TRUE(r.ib_disabled());
  EXPECT_THAT(r.env(),
              UnorderedElementsAre(Pair("NCCL_IB_DISABLE", "1"), Pair("NCCL_SOCKET_IFNAME", "en")));
  EXPECT_THAT(r.nics(), ElementsAre("eno2:10.42.0.2<0>"));
  EXPECT_EQ(r.bootstrap_interface(), "eno2:10.42.0.2<0>");
  EXPECT_EQ(r.connections_size(), 0);
}

TEST(NcclLogTest, SocketBetweenNodesAndShmInsideThem) {
  const std::string log = Fixture("socket_and_shm_two_nodes.log");
  const v1::NcclReport last = ParseNcclLog(log, 15);
  EXPECT_EQ(
      Connections(last),
      "14:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;15:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;"
      "16:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;17:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;"
      "18:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;19:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;"
      "20:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;21:15->0 NCCL_TRANSPORT_NET_SOCKET net nic0;"
      "12:14->15 NCCL_TRANSPORT_SHM;");
  EXPECT_EQ(last.gdr_state(), "disabled");
  const v1::NcclReport inner = ParseNcclLog(log, 11);
  EXPECT_EQ(Connections(inner),
            "5:11->12 NCCL_TRANSPORT_SHM;6:11->12 NCCL_TRANSPORT_SHM;7:11->12 NCCL_TRANSPORT_SHM;"
            "13:10->11 NCCL_TRANSPORT_SHM;12:11->12 NCCL_TRANSPORT_SHM;"
            "14:10->11 NCCL_TRANSPORT_SHM;");
  EXPECT_EQ(inner.connections(0).via(), "SHM/direct/direct");
  EXPECT_EQ(inner.gdr_state(), "");
}

TEST(NcclLogTest, OneNodeOverShmWithRingsTreesAndChannels) {
  const v1::NcclReport r = ParseNcclLog(Fixture("shm_one_node_h800.log"), 0);
  EXPECT_EQ(r.host(), "tj5-sc-ai-h800r-dev01");
  EXPECT_EQ(r.nranks(), 4);
  EXPECT_EQ(r.cuda_device(), 0);
  EXPECT_EQ(r.bus_id(), "9a000");
  EXPECT_EQ(r.nchannels(), 16);
  ASSERT_EQ(r.rings_size(), 4);
  EXPECT_EQ(r.rings(0).channel(), 12);
  EXPECT_EQ(r.rings(0).path(), "0 1 2 3");
  EXPECT_THAT(r.rings(3).ranks(), ElementsAre(0, 1, 2, 3));
  ASSERT_EQ(r.trees_size(), 16);
  EXPECT_EQ(r.trees(15).channel(), 15);
  EXPECT_EQ(r.trees(0).path(), "1/-1/-1->0->-1");
  EXPECT_EQ(Connections(r),
            "0:0->1 NCCL_TRANSPORT_SHM;1:0->1 NCCL_TRANSPORT_SHM;2:0->1 NCCL_TRANSPORT_SHM;"
            "3:0->1 NCCL_TRANSPORT_SHM;");
  EXPECT_EQ(r.gdr_state(), "");
}

TEST(NcclLogTest, ModernConnectionSpellingsAndWarnings) {
  const v1::NcclReport r = ParseNcclLog(
      "h:1:2 [0] NCCL INFO comm 0xab rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
      "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
      "h:1:2 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IBext_v8/2/GDRDMA\n"
      "h:1:2 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0\n"
      "h:1:2 [0] NCCL INFO Channel 03/0 : 0[0] -> 1[1] via P2P/IPC\n"
      "h:1:2 [0] NCCL INFO ncclCommInitRankConfig comm 0xab rank 0 nranks 2 cudaDev 0 nvmlDev 3 "
      "busId 18000 commId 0x1 - Init COMPLETE\n"
      "h:1:2 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion with error 12\n",
      0);
  EXPECT_EQ(r.nnodes(), 2);
  EXPECT_EQ(r.local_ranks(), 1);
  EXPECT_EQ(r.bus_id(), "18000");
  EXPECT_EQ(Connections(r),
            "0:0->1 NCCL_TRANSPORT_P2P;1:1->0 NCCL_TRANSPORT_NET_IB gdr net nic2;"
            "2:0->1 NCCL_TRANSPORT_NET_OTHER net nic0;3:0->1 NCCL_TRANSPORT_P2P;");
  EXPECT_THAT(r.warnings(), ElementsAre("NET/IB : Got completion with error 12"));
}

TEST(NcclLogTest, HostileInputIsBoundedAndNeverFails) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string junk(rng() % 4000, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    junk += "\nx:1:1 [0] NCCL INFO Channel 99999999999 : -1[ -> via \n NCCL INFO Trees [ \n";
    const v1::NcclReport r = ParseNcclLog(junk, -1);
    EXPECT_TRUE(CheckNcclReport(r).ok()) << CheckNcclReport(r);
  }
  std::string many;
  for (int i = 0; i < 5000; ++i) {
    many += "h:1:2 [0] NCCL INFO Channel " + std::to_string(i % 1000) + "/0 : 0[0] -> " +
            std::to_string(i + 1) + "[1] via SHM/direct/direct\n";
    many += "h:1:2 [0] NCCL INFO NCCL_X" + std::to_string(i) + " set by environment to 1.\n";
    many += "h:1:2 [0] NCCL INFO NET/IB : Using [" + std::to_string(i) + "]mlx5_" +
            std::to_string(i) + ":1/IB\n";
    many += "h:1:2 [0] misc.cc:1 NCCL WARN " + std::string(2000, 'w') + "\n";
  }
  many += std::string(1 << 20, 'x');  // one line over the line limit
  const v1::NcclReport r = ParseNcclLog(many, 0);
  EXPECT_EQ(r.connections_size(), kMaxNcclConnections);
  EXPECT_EQ(r.env_size(), kMaxNcclEnv);
  EXPECT_EQ(r.nics_size(), kMaxNcclNics);
  EXPECT_EQ(r.warnings_size(), kMaxNcclWarnings);
  EXPECT_TRUE(CheckNcclReport(r).ok()) << CheckNcclReport(r);
  v1::NcclReport fitted = r;
  SetTopologyXml(std::string(kMaxTopologyXmlBytes, 'x'), &fitted);
  EXPECT_EQ(fitted.topology_xml().size(), kMaxTopologyXmlBytes);
  FitNcclReport(&fitted, 16 << 10);
  EXPECT_LE(ReportJson(fitted).dump().size(), size_t{16 << 10});
  EXPECT_TRUE(fitted.topology_xml().empty());
  EXPECT_LT(fitted.connections_size(), kMaxNcclConnections);
  v1::NcclReport too_big;
  SetTopologyXml(std::string(kMaxTopologyXmlBytes + 1, 'x'), &too_big);
  EXPECT_TRUE(too_big.topology_xml().empty());
  EXPECT_EQ(too_big.warnings_size(), 1);
}

TEST(NcclLogTest, PlanSetsOnlyWhatTheJobDidNotAndDumpsTheTopologyOncePerNode) {
  auto none = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  const NcclLogPlan lead = PlanNcclLog(none, 8, 0, "/d", "node-b", 42);
  std::map<std::string, std::string> set(lead.set_env.begin(), lead.set_env.end());
  EXPECT_THAT(set, UnorderedElementsAre(Pair("NCCL_DEBUG", "INFO"),
                                        Pair("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET"),
                                        Pair("NCCL_DEBUG_FILE", "/d/nccl-rank8.log"),
                                        Pair("NCCL_TOPO_DUMP_FILE", "/d/nccl-topo-rank8.xml"),
                                        Pair("NCCL_TOPO_DUMP_FILE_RANK", "8")));
  EXPECT_EQ(lead.debug_file, "/d/nccl-rank8.log");
  EXPECT_EQ(lead.topo_file, "/d/nccl-topo-rank8.xml");
  const NcclLogPlan other = PlanNcclLog(none, 9, 1, "/d", "node-b", 43);
  EXPECT_EQ(other.set_env.size(), 3u);
  EXPECT_EQ(other.topo_file, "");

  std::map<std::string, std::string> job = {{"NCCL_DEBUG", "WARN"},
                                            {"NCCL_DEBUG_FILE", "/logs/%h.%p.txt"}};
  auto from_job = [&](const std::string& name) -> std::optional<std::string> {
    auto it = job.find(name);
    if (it == job.end()) return std::nullopt;
    return it->second;
  };
  const NcclLogPlan kept = PlanNcclLog(from_job, 3, 1, "/d", "node-a", 77);
  EXPECT_THAT(kept.set_env, ElementsAre(Pair("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET")));
  EXPECT_EQ(kept.debug_file, "/logs/node-a.77.txt");
}

// Captures what the trainer would write, as the lines the worker relays.
class CapturingSink final : public EventSink {
 public:
  void Emit(const std::string& type, nlohmann::json fields) override {
    fields["type"] = type;
    lines.push_back(fields.dump());
  }
  std::vector<std::string> lines;
};

TEST(NcclLogTest, LogFileBecomesATopologyEventTheCoordinatorReadsBackTyped) {
  const fs::path dir = fs::temp_directory_path() / ("nccl_log_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  NcclLogPlan plan;
  plan.debug_file = (dir / "nccl-rank0.log").string();
  plan.topo_file = (dir / "nccl-topo-rank0.xml").string();
  std::ofstream(plan.debug_file) << Fixture("shm_one_node_h800.log");
  const std::string xml = "<system version=\"1\">\n  <cpu numaid=\"0\">\n  </cpu>\n</system>\n";
  std::ofstream(plan.topo_file) << xml;

  CapturingSink sink;
  ReportNcclTopology(plan, 0, "fallback-host", &sink);
  ASSERT_EQ(sink.lines.size(), 1u);
  EXPECT_LE(sink.lines[0].size(), kMaxReportJsonBytes + 100);
  const nlohmann::json event = nlohmann::json::parse(sink.lines[0]);
  EXPECT_EQ(event["type"], "topology");
  EXPECT_EQ(event["rank"], 0);
  auto typed = NcclReportFromEvent(event);
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->host(), "tj5-sc-ai-h800r-dev01");
  EXPECT_EQ(typed->topology_xml(), xml);
  EXPECT_EQ(typed->trees_size(), 16);
  auto direct = ReadNcclReport(plan, 0, "fallback-host");
  ASSERT_TRUE(direct.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*typed, *direct));

  // No log (NCCL never initialised): a warning, not a report.
  plan.debug_file = (dir / "missing.log").string();
  ReportNcclTopology(plan, 3, "h", &sink);
  ASSERT_EQ(sink.lines.size(), 2u);
  const nlohmann::json warning = nlohmann::json::parse(sink.lines[1]);
  EXPECT_EQ(warning["type"], "warning");
  EXPECT_THAT(warning["message"].get<std::string>(), ::testing::HasSubstr("missing.log"));
  fs::remove_all(dir);
}

TEST(NcclLogTest, CoordinatorRefusesBrokenReportsNamingTheField) {
  auto check = [](const std::string& event) {
    return NcclReportFromEvent(nlohmann::json::parse(event)).status();
  };
  EXPECT_THAT(std::string(check(R"({"type":"topology"})").message()),
              ::testing::HasSubstr("no \"report\""));
  EXPECT_THAT(std::string(check(R"({"report":{"rank":"x"}})").message()),
              ::testing::HasSubstr("not a report"));
  EXPECT_THAT(std::string(check(R"({"report":{"rank":-3}})").message()),
              ::testing::HasSubstr("nccl.rank"));
  EXPECT_THAT(std::string(check(R"({"report":{"connections":[{"from_rank":1,"to_rank":2,
              "transport":99}]}})")
                              .message()),
              ::testing::HasSubstr("connections[0].transport"));
  EXPECT_THAT(std::string(check(R"({"report":{"gdr_state":"maybe"}})").message()),
              ::testing::HasSubstr("gdr_state"));
  EXPECT_TRUE(check(R"({"report":{"rank":2,"future_field":1}})").ok());
}

TEST(BandwidthReportTest, CoordinatorRefusesBrokenReportsNamingTheField) {
  auto check = [](const std::string& event) {
    return BandwidthReportFromEvent(nlohmann::json::parse(event)).status();
  };
  EXPECT_TRUE(check(R"({"report":{"world_size":2,"rows":[{"collective":"all_reduce","bytes":"1024",
      "time_us":10,"algbw_gbps":0.1,"busbw_gbps":0.1,"rank_time_us":[9,10]}]}})")
                  .ok());
  EXPECT_THAT(std::string(check(R"({"report":{"world_size":0}})").message()),
              ::testing::HasSubstr("bandwidth.world_size"));
  EXPECT_THAT(std::string(check(R"({"report":{"world_size":2,"rows":[{"collective":"gossip",
      "bytes":"4"}]}})")
                              .message()),
              ::testing::HasSubstr("rows[0].collective"));
  EXPECT_THAT(std::string(check(R"({"report":{"world_size":2,"rows":[{"collective":"all_gather",
      "bytes":"8","rank_time_us":[1]}]}})")
                              .message()),
              ::testing::HasSubstr("rows[0].rank_time_us"));
  EXPECT_THAT(std::string(check(R"({"report":{"world_size":2,"rows":[{"collective":"all_gather",
      "bytes":"8","time_us":-1}]}})")
                              .message()),
              ::testing::HasSubstr("finite"));
}

}  // namespace
}  // namespace trainctl::trainer
