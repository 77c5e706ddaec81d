package redis

import (
	_ "embed"

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

	// A script cannot load another, so both decisions carry the shared
	// arithmetic in front of their own code.
	acquireSource = libLua + "\n" + acquireLua
	acquireScript = rueidis.NewLuaScript(acquireSource)
	// availableScript writes nothing, so it runs as EVALSHA_RO / EVAL_RO.
	availableScript = rueidis.NewLuaScriptReadOnly(libLua + "\n" + availableLua)
	putScript       = rueidis.NewLuaScript(putLua)
	deleteScript    = rueidis.NewLuaScript(deleteLua)
)
