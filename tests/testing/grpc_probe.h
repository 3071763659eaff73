// Calls the standard gRPC services a trainctl daemon exposes, without their generated stubs
// (Debian ships neither health.proto nor reflection.proto): raw protobuf bytes over a GenericStub.
#ifndef TRAINCTL_TESTS_TESTING_GRPC_PROBE_H_
#define TRAINCTL_TESTS_TESTING_GRPC_PROBE_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainctl::testing {

// grpc.health.v1.Health/Check for the whole server: true when it answers SERVING. Over
// `credentials` (null: plaintext), with no token.
absl::StatusOr<bool> HealthServing(const std::string& address,
                                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// grpc.reflection.v1alpha.ServerReflection list_services: the raw response bytes, which hold each
// service's full name as a string field.
absl::StatusOr<std::string> ReflectionListServices(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_GRPC_PROBE_H_
