#include "common/status.h"

#include <gtest/gtest.h>

#include "common/result.h"

namespace kvo {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd value " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  KVO_ASSIGN_OR_RETURN(int h, Half(x));
  KVO_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  KVO_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(StatusTest, CodesMessagesAndContext) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::Corruption("bad record at 12");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "Corruption: bad record at 12");
  EXPECT_EQ(s.WithContext("journal 0001.kvj").ToString(),
            "Corruption: journal 0001.kvj: bad record at 12");
  EXPECT_EQ(Status::Ok().WithContext("x"), Status::Ok());
}

TEST(ResultTest, PropagatesErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToString(), "InvalidArgument: odd value 3");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  EXPECT_DEATH({ (void)Quarter(3).value(); }, "KVO_CHECK failed");
}

}  // namespace
}  // namespace kvo
