// Keeps the oracle library non-empty even before any oracle source exists.
namespace kvtrim_oracle_anchor {
int anchor = 0;
}  // namespace kvtrim_oracle_anchor
