#include "tests/testing/grpc_probe.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainctl::testing {
namespace {

absl::Status Convert(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer FromString(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// One request, one response over a generic stub with a completion queue.
absl::StatusOr<std::string> Call(const std::string& address,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 const std::string& method, const std::string& request,
                                 bool streaming) {
  auto channel = grpc::CreateChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer response;
  grpc::Status status;
  void* tag;
  bool ok;
  if (!streaming) {
    auto call = stub.PrepareUnaryCall(&context, method, FromString(request), &cq);
    call->StartCall();
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    if (!status.ok()) return Convert(status);
    return ToString(response);
  }
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer out = FromString(request);
  call->Write(out, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  call->Read(&response, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  const bool read_ok = ok;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  if (!status.ok()) return Convert(status);
  if (!read_ok) return absl::UnknownError("no reflection response");
  return ToString(response);
}

}  // namespace

absl::StatusOr<bool> HealthServing(const std::string& address,
                                   std::shared_ptr<grpc::ChannelCredentials> credentials) {
  // HealthCheckRequest{service: ""} is the empty message; HealthCheckResponse{status: SERVING=1}
  // is field 1, varint 1.
  auto response = Call(address, std::move(credentials), "/grpc.health.v1.Health/Check", "",
                       /*streaming=*/false);
  if (!response.ok()) return response.status();
  return *response == std::string("\x08\x01", 2);
}

absl::StatusOr<std::string> ReflectionListServices(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  // ServerReflectionRequest{list_services: "*"}: field 7, length-delimited.
  return Call(address, std::move(credentials),
              "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
              std::string("\x3a\x01*", 3), /*streaming=*/true);
}

}  // namespace trainctl::testing
