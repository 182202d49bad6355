// A desktop stand-in for android.content.Context, which gobind's go.Seq
// names in a method the test never calls (jvm_test.go).
package android.content;

public class Context {}
