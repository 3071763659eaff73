#include "common/rank_env.h"

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

}  // namespace
}  // namespace trainctl
