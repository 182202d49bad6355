/*
 * A desktop stand-in for Android's <android/log.h>, so that the JNI half of
 * gobind's Java bindings builds as a shared library for a desktop JVM
 * (jvm_test.go): log lines go to stderr.
 */
#ifndef IDEMRETRY_SHIM_ANDROID_LOG_H
#define IDEMRETRY_SHIM_ANDROID_LOG_H
#include <stdio.h>
#define ANDROID_LOG_INFO 4
#define ANDROID_LOG_FATAL 7
#define __android_log_print(prio, tag, ...) \
	(fprintf(stderr, "%s: ", (tag)), fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n"))
#endif
