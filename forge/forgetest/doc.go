// Package forgetest is an in-memory forge for the tests of the forge's consumers (the
// scheduler and the facade): a forge.Forge that hands out queued tasks and records what it is
// told, and a sample task.
package forgetest
