#include "common/rank_env.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RankEnvPolicyTest, DefaultAllowsTheListedPrefixesAndNames) {
  const RankEnvPolicy policy;
  for (const char* name :
       {"NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL", "CUDA_LAUNCH_BLOCKING",
        "OMP_NUM_THREADS", "TORCH_SHOW_CPP_STACKTRACES", "PYTORCH_CUDA_ALLOC_CONF", "HF_HOME",
        "TOKENIZERS_PARALLELISM", "TRAINCTL_PEAK_FLOPS", "OPENAI_API_KEY", "GLOO_SOCKET_IFNAME",
        "MALLOC_ARENA_MAX"}) {
    EXPECT_EQ(policy.Refusal(name), "") << name;
  }
}

TEST(RankEnvPolicyTest, DefaultRefusesLoaderAndInterpreterVariables) {
  const RankEnvPolicy policy;
  for (const char* name : {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH", "PYTHONPATH",
                           "BASH_ENV", "GCONV_PATH", "HOME", "NCCL", "CUDA", "OPENAI_API_KEY2"}) {
    EXPECT_THAT(policy.Refusal(name), HasSubstr("not in the ranks' environment allowlist (NCCL_*"))
        << name;
  }
  EXPECT_THAT(policy.Refusal("LD_PRELOAD"), HasSubstr("--rank_env_allow"));
}

TEST(RankEnvPolicyTest, RefusesCodeLoadingNamesInsideAllowedPrefixes) {
  const RankEnvPolicy policy;
  for (const char* name : {"CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
                           "NCCL_CONF_FILE", "NCCL_DEBUG_FILE", "OMP_TOOL_LIBRARIES"}) {
    EXPECT_THAT(policy.Refusal(name), HasSubstr("may make the ranks load code")) << name;
  }
}

TEST(RankEnvPolicyTest, RefusesNamesThatAreNotIdentifiers) {
  const RankEnvPolicy policy;
  for (const char* name : {"", "1NCCL", "NCCL_A=B", "NCCL DEBUG", "NCCL-DEBUG", "NCCL_\n"}) {
    EXPECT_THAT(policy.Refusal(name), HasSubstr("not a valid environment variable name"))
        << "'" << name << "'";
  }
}

TEST(RankEnvPolicyTest, OperatorExtendsByNameAndPrefix) {
  auto policy = RankEnvPolicy::WithExtra(" MY_FLAG , MYLIB_*,,NCCL_NET_PLUGIN");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->Refusal("MY_FLAG"), "");
  EXPECT_EQ(policy->Refusal("MYLIB_THREADS"), "");
  EXPECT_EQ(policy->Refusal("NCCL_NET_PLUGIN"), "");  // listed exactly: the operator's choice
  EXPECT_NE(policy->Refusal("MY_FLAG2"), "");
  EXPECT_NE(policy->Refusal("NCCL_TUNER_PLUGIN"), "");
  EXPECT_NE(policy->Refusal("LD_PRELOAD"), "");
  EXPECT_THAT(policy->Refusal("LD_PRELOAD"), HasSubstr("MY_FLAG, MYLIB_*, NCCL_NET_PLUGIN)"));
}

TEST(RankEnvPolicyTest, APrefixDoesNotOverrideTheDeniedNames) {
  auto policy = RankEnvPolicy::WithExtra("NCCL_*");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_NE(policy->Refusal("NCCL_NET_PLUGIN"), "");
}

TEST(RankEnvPolicyTest, BadExtraItemsAreNamed) {
  for (const char* bad : {"A=B", "*", "LD_*_X", "1X", "A B", "X**"}) {
    auto policy = RankEnvPolicy::WithExtra(bad);
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(policy.status().message(), HasSubstr(absl::StrCat("'", bad, "'"))) << bad;
  }
}

TEST(RankEnvErrorsTest, OneLinePerRefusedNameInNameOrder) {
  google::protobuf::Map<std::string, std::string> env;
  env["NCCL_DEBUG"] = "INFO";
  env["LD_PRELOAD"] = "/tmp/evil.so";
  env["CUDA_INJECTION64_PATH"] = "/tmp/evil.so";
  const std::vector<std::string> errors = RankEnvErrors(env, RankEnvPolicy(), "spec.env");
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_THAT(errors[0], HasSubstr("spec.env.CUDA_INJECTION64_PATH: may make the ranks load"));
  EXPECT_THAT(errors[1], HasSubstr("spec.env.LD_PRELOAD: not in the ranks' environment allowlist"));
  env.erase("LD_PRELOAD");
  env.erase("CUDA_INJECTION64_PATH");
  EXPECT_THAT(RankEnvErrors(env, RankEnvPolicy(), "spec.env"), IsEmpty());
}

// However many names are refused, the message stays small: it travels in gRPC trailers.
TEST(RankEnvErrorsTest, ManyRefusedNamesAreCountedNotListed) {
  google::protobuf::Map<std::string, std::string> env;
  for (int i = 0; i < 200; ++i) env[absl::StrCat("V", 1000 + i)] = "1";
  env[std::string(128, 'K')] = "1";
  const std::vector<std::string> errors = RankEnvErrors(env, RankEnvPolicy(), "spec.env");
  ASSERT_EQ(errors.size(), 9u);
  EXPECT_THAT(errors[0], HasSubstr("spec.env.KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK...: not in"));
  EXPECT_EQ(errors[8], "spec.env.V1007: refused likewise, with 192 more variables after it");
  size_t bytes = 0;
  for (const std::string& e : errors) bytes += e.size();
  EXPECT_LT(bytes, 4096u);
}

TEST(IsEnvNameTest, Identifiers) {
  EXPECT_TRUE(IsEnvName("_A1"));
  EXPECT_TRUE(IsEnvName("a"));
  EXPECT_FALSE(IsEnvName("9"));
  EXPECT_FALSE(IsEnvName("A.B"));
}

// What the worker writes, the trainer reads back unchanged.
TEST(RankEnvTest, WhatTheWorkerWritesTheTrainerReadsBack) {
  RankEnv written;
  written.rank = 3;
  written.local_rank = 1;
  written.world_size = 4;
  written.local_world_size = 2;
  written.node_rank = 1;
  written.master_addr = "10.0.0.1";
  written.master_port = 29500;
  written.node_addr = "10.0.0.2";
  written.job_id = "j-1";
  written.task_id = "t-1";
  written.attempt = 2;
  std::map<std::string, std::string> vars = written.WorkerVariables();
  vars[kRankEventFdVariable] = "3";
  vars["NCCL_DEBUG"] = "INFO";
  vars["TRAINCTL_MODEL_REGISTRY"] = "/srv/models";
  RankEnv env;
  const absl::Status status = RankEnv::Parse(vars, &env);
  ASSERT_TRUE(status.ok()) << status;
  const RankEnv* read = &env;
  EXPECT_EQ(read->rank, 3);
  EXPECT_EQ(read->local_rank, 1);
  EXPECT_EQ(read->world_size, 4);
  EXPECT_EQ(read->local_world_size, 2);
  EXPECT_EQ(read->node_rank, 1);
  EXPECT_EQ(read->master_addr, "10.0.0.1");
  EXPECT_EQ(read->master_port, 29500);
  EXPECT_EQ(read->node_addr, "10.0.0.2");
  EXPECT_EQ(read->job_id, "j-1");
  EXPECT_EQ(read->task_id, "t-1");
  EXPECT_EQ(read->attempt, 2);
  EXPECT_EQ(read->event_fd, 3);
  EXPECT_EQ(read->model_registry, "/srv/models");
  EXPECT_EQ(read->nccl, (std::map<std::string, std::string>{{"NCCL_DEBUG", "INFO"}}));
  // Every name the worker sets is reserved from a job's env.
  for (const auto& [name, value] : written.WorkerVariables()) {
    EXPECT_NE(std::find(WorkerSetVariables().begin(), WorkerSetVariables().end(), name),
              WorkerSetVariables().end())
        << name;
  }
}

TEST(RankEnvTest, AloneNeedsNothing) {
  RankEnv env;
  ASSERT_TRUE(RankEnv::Parse({}, &env).ok());
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.event_fd, -1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  // Alone, no process group forms: the port is not needed (an unrelated MASTER_PORT past 65535
  // is left alone), but it must still be a number when set.
  EXPECT_TRUE(RankEnv::Parse({{"MASTER_PORT", "70000"}}, &env).ok());
}

// Each error names the variable; the event pipe, read first, is known even when the rest fails.
TEST(RankEnvTest, ErrorsNameTheVariable) {
  auto error = [](std::map<std::string, std::string> vars) {
    vars[kRankEventFdVariable] = "3";
    RankEnv env;
    const absl::Status status = RankEnv::Parse(vars, &env);
    EXPECT_EQ(env.event_fd, 3);
    return std::string(status.message());
  };
  EXPECT_THAT(error({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_PORT", "29500"}}),
              HasSubstr("RANK: must be < WORLD_SIZE (2), got 2"));
  EXPECT_THAT(error({{"WORLD_SIZE", "2"}, {"RANK", "1"}}), HasSubstr("MASTER_PORT"));
  EXPECT_THAT(error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT: a port in [1, 65535] is required when WORLD_SIZE > 1"));
  EXPECT_THAT(error({{"WORLD_SIZE", "two"}}),
              HasSubstr("WORLD_SIZE: must be an integer >= 1, got 'two'"));
  EXPECT_THAT(error({{"TRAINCTL_COMM_SINGLE_RANK_GROUP", "1"}}),
              HasSubstr("TRAINCTL_COMM_SINGLE_RANK_GROUP=1"));
  EXPECT_THAT(error({{"MASTER_PORT", "tcp://10.0.0.1:29500"}}), HasSubstr("MASTER_PORT"));
  EXPECT_THAT(error({{"TRAINCTL_TEST_ADDRESS_SPACE_LIMIT", "lots"}}),
              HasSubstr("TRAINCTL_TEST_ADDRESS_SPACE_LIMIT"));
  RankEnv env;
  EXPECT_THAT(std::string(RankEnv::Parse({{kRankEventFdVariable, "pipe"}}, &env).message()),
              HasSubstr("TRAINCTL_EVENT_FD"));
  EXPECT_EQ(env.event_fd, -1);
}

}  // namespace
}  // namespace trainctl
