// Package shape holds no code: its test keeps the direction of kvtop's imports, the one
// paragraph of the README's layout that a compiler cannot check by itself.
//
// Each rule names packages and what they must not depend on, directly or through anything
// they import (test files aside), and why. A broken rule is reported with the chain of
// imports that breaks it. Add a row to the table in shape_test.go for a new rule.
package shape
