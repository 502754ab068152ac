// Package ethtool talks SIOCETHTOOL to a netdev for what xdpq steers with:
// channel counts, the RSS indirection table and RSS contexts, and ntuple
// (rxnfc) classification rules.
//
// It is written here because no maintained Go library covers rxnfc: the
// ethtool netlink family has no ntuple messages, and the Go ethtool
// packages (mdlayher/ethtool, safchain/ethtool) do links, features and
// statistics only. The encoding of every rule kind is checked byte for
// byte against what Debian's ethtool 6.1 passes to the kernel for the same
// rule (testdata/capture.sh).
//
// A Handle works in one network namespace: the netns its socket was made in.
package ethtool
