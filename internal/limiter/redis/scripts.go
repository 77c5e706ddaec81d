package redis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"github.com/redis/rueidis"
)

// The server-side scripts. Each runs atomically on the server that holds
// its keys; rueidis sends EVALSHA and falls back to EVAL when the server
// answers NOSCRIPT (after a restart, a failover or SCRIPT FLUSH).
var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/available.lua
	availableLua string
	//go:embed lua/put.lua
	putLua string
	//go:embed lua/delete.lua
	deleteLua string
	//go:embed lua/create.lua
	createLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/unclaim.lua
	unclaimLua string
	//go:embed lua/decide.lua
	decideLua string
	//go:embed lua/budget.lua
	budgetLua string
	//go:embed lua/table.lua
	tableLua string
	//go:embed lua/key_acquire.lua
	keyAcquireLua string
	//go:embed lua/key_available.lua
	keyAvailableLua string
	//go:embed lua/key_lowest.lua
	keyLowestLua string

	// A script cannot load another, so both decisions carry the shared
	// arithmetic in front of their own code.
	acquireSource = libLua + "\n" + acquireLua
	acquireScript = rueidis.NewLuaScript(acquireSource)
	// acquireSHA1 names acquireSource in the EVALSHA commands AcquireBatch
	// pipelines itself: rueidis.Lua keeps its digest to itself, and its
	// ExecMulti sends SCRIPT LOAD to every node first (see AcquireBatch).
	acquireSHA1 = digest(acquireSource)
	// availableScript writes nothing, so it runs as EVALSHA_RO / EVAL_RO.
	availableScript = rueidis.NewLuaScriptReadOnly(libLua + "\n" + availableLua)
	putScript       = rueidis.NewLuaScript(putLua)
	deleteScript    = rueidis.NewLuaScript(deleteLua)
	// createSHA1 names createLua in the EVALSHA commands Create pipelines.
	createSHA1    = digest(createLua)
	reserveScript = rueidis.NewLuaScript(reserveLua)
	claimScript   = rueidis.NewLuaScript(claimLua)
	budgetScript  = rueidis.NewLuaScript(budgetLua)
	unclaimScript = rueidis.NewLuaScript(unclaimLua)
	// decideScript decides several limiters of one group together, and
	// the keys of keyed limiters with the tables' code.
	decideSource = libLua + "\n" + tableLua + "\n" + decideLua
	decideScript = rueidis.NewLuaScript(decideSource)

	// The scripts of tables of keys: the library, then table.lua, then
	// their own code.
	acquireKeySource = tableScript(keyAcquireLua)
	acquireKeyScript = rueidis.NewLuaScript(acquireKeySource)
	// acquireKeySHA1 names acquireKeySource in the EVALSHA commands
	// AcquireBatch pipelines.
	acquireKeySHA1 = digest(acquireKeySource)
	// availableKeyScript writes nothing, so it runs as EVALSHA_RO / EVAL_RO.
	availableKeyScript = rueidis.NewLuaScriptReadOnly(tableScript(keyAvailableLua))
	// lowestKeysScript trims expired index members, so it is not read-only.
	lowestKeysScript = rueidis.NewLuaScript(tableScript(keyLowestLua))
	// lowestKeysSHA1 is what Table.Lowest pipelines to every shard at once,
	// falling back to lowestKeysScript.Exec for a shard whose server
	// answers NOSCRIPT.
	lowestKeysSHA1 = digest(tableScript(keyLowestLua))
)

func tableScript(own string) string {
	return libLua + "\n" + tableLua + "\n" + own
}

// digest is the SHA-1 digest by which EVALSHA names a script's source.
func digest(source string) string {
	sum := sha1.Sum([]byte(source))
	return hex.EncodeToString(sum[:])
}
